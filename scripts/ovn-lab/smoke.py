"""The OVN lab's own check: two ports bound to the two chassis, plugged by hand, ping over geneve.

Run by `ovn-lab.sh smoke` (with the lab's venv python, for `requests`). It creates a project of
its own (network, subnet, a security group allowing ICMP), one port per node, a network namespace
per port wired to the node's br-int the way the CNI daemon does it (veth, external-ids iface-id,
attached-mac, iface-status, TX checksum offload off on the pod side), waits for both ports to go
ACTIVE (OVN bound them), pings across the nodes both ways and removes everything again. Prints
how long each stage took; exits non-zero on the first failure.
"""

import os
import subprocess
import sys
import time
import uuid

import requests

API = os.environ["OVN_API_URL"] + "/v2.0"
LAB = os.environ["OVN_LAB"]
NODES = os.environ["OVN_NODES"].split()
PROJECT = "ovn-lab-smoke"
T0 = time.monotonic()


def log(*a):
    print(f"[smoke +{time.monotonic() - T0:5.1f}s]", *a, flush=True)


def req(method, path, body=None):
    # noauth: the owner goes in the body, never in a header.
    if method == "POST" and body:
        for v in body.values():
            v.setdefault("project_id", PROJECT)
    r = requests.request(method, API + path, json=body, timeout=60)
    if r.status_code >= 400:
        raise SystemExit(f"{method} {path} -> {r.status_code} {r.text}")
    return r.json() if r.text else None


def sh(*cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode:
        raise SystemExit(f"FAILED {' '.join(cmd)}: {p.stdout}{p.stderr}")
    return p


def node_ns(node):
    with open(f"{LAB}/nodes/{node}/netns") as f:
        return f.read().strip()


def vsctl(node, *args):
    return sh("ovs-vsctl", f"--db=unix:{LAB}/nodes/{node}/db.sock", "--timeout=10", *args)


def cleanup(state):
    for pod in state.get("pods", []):
        vsctl(pod["node"], "--if-exists", "del-port", pod["host"])
        sh("ip", "-n", node_ns(pod["node"]), "link", "del", pod["host"], check=False)
        sh("ip", "netns", "del", pod["ns"], check=False)
    for p in req("GET", f"/ports?project_id={PROJECT}")["ports"]:
        req("DELETE", f"/ports/{p['id']}")
    for n in req("GET", f"/networks?project_id={PROJECT}")["networks"]:
        req("DELETE", f"/networks/{n['id']}")
    for g in req("GET", f"/security-groups?project_id={PROJECT}")["security_groups"]:
        if g["name"] != "default":
            req("DELETE", f"/security-groups/{g['id']}")


def main():
    state = {"pods": []}
    cleanup(state)
    try:
        net = req("POST", "/networks", {"network": {"name": "smoke"}})["network"]
        sub = req("POST", "/subnets", {"subnet": {"network_id": net["id"], "ip_version": 4,
                                                  "cidr": "10.199.0.0/24", "name": "smoke"}})["subnet"]
        sg = req("POST", "/security-groups", {"security_group": {"name": "smoke"}})["security_group"]
        req("POST", "/security-group-rules", {"security_group_rule": {
            "security_group_id": sg["id"], "direction": "ingress", "protocol": "icmp",
            "ethertype": "IPv4"}})
        log(f"network {net['id']} ({net.get('provider:network_type')}, MTU {net['mtu']})")
        for i, node in enumerate(NODES):
            port = req("POST", "/ports", {"port": {
                "network_id": net["id"], "binding:host_id": node, "device_owner": "compute:smoke",
                "device_id": str(uuid.uuid4()), "security_groups": [sg["id"]]}})["port"]
            if port["binding:vif_type"] != "ovs":
                raise SystemExit(f"port on {node} bound as {port['binding:vif_type']!r}, not ovs")
            ip = port["fixed_ips"][0]["ip_address"]
            pod = {"node": node, "ns": f"ovnsmoke{i}", "host": f"tapsmoke{i}", "ip": ip, "id": port["id"]}
            state["pods"].append(pod)
            sh("ip", "netns", "add", pod["ns"])
            sh("ip", "-n", pod["ns"], "link", "set", "lo", "up")
            sh("ip", "-n", node_ns(node), "link", "add", pod["host"], "type", "veth", "peer", "name", "eth0",
               "netns", pod["ns"])
            sh("ip", "-n", pod["ns"], "link", "set", "eth0", "address", port["mac_address"], "mtu",
               str(net["mtu"]), "up")
            sh("ip", "-n", pod["ns"], "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "netns", "exec", pod["ns"], "ethtool", "-K", "eth0", "tx", "off")
            sh("ip", "-n", node_ns(node), "link", "set", pod["host"], "up")
            vsctl(node, "--may-exist", "add-port", "br-int", pod["host"], "--", "set", "Interface", pod["host"],
                  f"external-ids:iface-id={port['id']}", f"external-ids:attached-mac={port['mac_address']}",
                  "external-ids:iface-status=active")
        for pod in state["pods"]:
            deadline = time.monotonic() + 60
            while req("GET", f"/ports/{pod['id']}")["port"]["status"] != "ACTIVE":
                if time.monotonic() > deadline:
                    raise SystemExit(f"port {pod['id']} on {pod['node']} never went ACTIVE")
                time.sleep(0.2)
        log("both ports ACTIVE (bound by ovn-controller)")
        a, b = state["pods"]
        for src, dst in ((a, b), (b, a)):
            deadline = time.monotonic() + 30
            while sh("ip", "netns", "exec", src["ns"], "ping", "-c1", "-W1", dst["ip"], check=False).returncode:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{src['node']} -> {dst['node']} ({dst['ip']}): no ping reply in 30 s")
            log(f"ping {src['node']} -> {dst['node']} ({dst['ip']}) over geneve: ok")
        del sub
    finally:
        cleanup(state)
    log("done")


if __name__ == "__main__":
    sys.exit(main())
