"""Octavia API and v2 (taskflow) worker in one process, for the lab.

oslo.messaging's `fake:/` transport only delivers inside one process, so
running the API and the worker together is what lets the lab work without a
message broker: the API's amphora provider driver casts to the worker's
consumer over the shared in-process transport.  The API is Octavia's own WSGI
application (octavia.api.app.setup_app) served by a threaded wsgiref server.

usage: octavia_lab_server.py --config-file octavia.conf --bind HOST:PORT
       octavia_lab_server.py --config-file octavia.conf --driver-agent -- [--log-file F]
The second form runs octavia-driver-agent with the same lab shims (see
lab_shims) that the ovn provider needs in both processes.
"""
import argparse
import configparser
import signal
import socketserver
import sys
import threading
from wsgiref import simple_server


class ThreadingWSGIServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


class QuietHandler(simple_server.WSGIRequestHandler):
    # oslo.log already records each request; wsgiref's stderr line is noise.
    def log_message(self, *args):
        pass


def lab_shims(config_file):
    """What the ovn provider needs to run against the lab, for both processes."""
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(config_file)
    if not conf.has_section("driver_agent"):
        return
    # ovn-octavia-provider builds octavia_lib's DriverLibrary() with its
    # default /var/run/octavia/*.sock paths, ignoring [driver_agent]; point
    # those defaults at the sockets this lab's driver agent listens on.  Done
    # before setup_app, which already loads the provider drivers.
    from octavia_lib.api.drivers import driver_lib
    da = conf["driver_agent"]
    defaults = list(driver_lib.DriverLibrary.__init__.__defaults__)
    for i, key in enumerate(("status_socket_path", "stats_socket_path", "get_socket_path")):
        if key in da:
            defaults[i] = da[key]
    driver_lib.DriverLibrary.__init__.__defaults__ = tuple(defaults)
    # The lab's neutron-server is noauth.  keystoneauth's `none` plugin cannot
    # live in [neutron] itself (its `endpoint` option clashes with the
    # provider's own [neutron] endpoint), so [neutron] names an auth_section,
    # and keystoneauth only reads groups that are registered.
    section = conf.get("neutron", "auth_section", fallback=None)
    if section:
        from keystoneauth1 import loading as ks_loading
        from oslo_config import cfg
        ks_loading.register_auth_conf_options(cfg.CONF, section)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-file", required=True)
    ap.add_argument("--bind")
    ap.add_argument("--driver-agent", action="store_true",
                    help="run octavia-driver-agent (same shims) instead of the API")
    ap.add_argument("extra", nargs="*", help="more driver agent arguments (after --)")
    a = ap.parse_args()
    if not a.driver_agent and not a.bind:
        ap.error("--bind is required")

    from octavia.api import app as api_app
    from octavia.controller.queue.v2 import consumer
    from oslo_config import cfg

    lab_shims(a.config_file)
    if a.driver_agent:
        from octavia.cmd import driver_agent
        sys.argv = ["octavia-driver-agent", "--config-file", a.config_file] + a.extra
        return driver_agent.main()

    host, _, port = a.bind.rpartition(":")
    # setup_app parses the config, sets up logging and the RPC transport.
    application = api_app.setup_app(argv=["octavia-lab", "--config-file", a.config_file])
    worker = consumer.ConsumerService(0, cfg.CONF)
    worker.run()

    server = simple_server.make_server(host, int(port), application,
                                       server_class=ThreadingWSGIServer,
                                       handler_class=QuietHandler)

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"octavia-lab: API on http://{host}:{port}, v2 worker consuming", flush=True)
    server.serve_forever()
    try:
        worker.terminate()
    except SystemExit:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
