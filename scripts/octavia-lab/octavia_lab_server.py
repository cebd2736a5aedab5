"""Octavia API and v2 (taskflow) worker in one process, for the lab.

oslo.messaging's `fake:/` transport only delivers inside one process, so
running the API and the worker together is what lets the lab work without a
message broker: the API's amphora provider driver casts to the worker's
consumer over the shared in-process transport.  The API is Octavia's own WSGI
application (octavia.api.app.setup_app) served by a threaded wsgiref server.

usage: octavia_lab_server.py --config-file octavia.conf --bind HOST:PORT
"""
import argparse
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-file", required=True)
    ap.add_argument("--bind", required=True)
    a = ap.parse_args()
    host, _, port = a.bind.rpartition(":")

    from octavia.api import app as api_app
    from octavia.controller.queue.v2 import consumer
    from oslo_config import cfg

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
