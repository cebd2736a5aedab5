"""Drives upstream kuryr-kubernetes 10.0.0's own K8sClient against an API server.

usage: python k8s_client_check.py BASE_URL
Prints one line per check and "OK <n> checks" at the end; exits non-zero on the first failure.
"""
import sys
import threading
import time

from kuryr_kubernetes import config

config.CONF([], project='kuryr-k8s')
config.CONF.set_override('token_file', '', 'kubernetes')
config.CONF.set_override('ssl_ca_crt_file', '', 'kubernetes')
config.CONF.set_override('use_events', True, 'kubernetes')

from kuryr_kubernetes import exceptions as exc  # noqa: E402
from kuryr_kubernetes import k8s_client  # noqa: E402

base = sys.argv[1]
c = k8s_client.K8sClient(base)
checks = 0


def check(name, cond):
    global checks
    if not cond:
        print(f"FAIL {name}")
        sys.exit(1)
    checks += 1
    print(f"ok {name}")


NS = 'upstream'
c.post('/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': NS}})
pod = c.post(f'/api/v1/namespaces/{NS}/pods', {
    'apiVersion': 'v1', 'kind': 'Pod',
    'metadata': {'name': 'p1', 'namespace': NS},
    'spec': {'nodeName': 'node-1', 'containers': [{'name': 'c', 'image': 'busybox'}]}})
check('post pod sets uid and resourceVersion', pod['metadata'].get('uid') and pod['metadata'].get('resourceVersion'))
pod_path = f'/api/v1/namespaces/{NS}/pods/p1'
got = c.get(pod_path)
check('get pod', got['metadata']['uid'] == pod['metadata']['uid'])

# Watch in a thread: upstream's generator-based watch over a streamed response.
events = []


def watcher():
    for ev in c.watch(f'/api/v1/namespaces/{NS}/pods'):
        events.append((ev.get('type'), ev['object']['metadata']['name']))
        if len(events) >= 2:
            return


t = threading.Thread(target=watcher, daemon=True)
t.start()
time.sleep(0.5)

check('add_finalizer', c.add_finalizer(got, 'kuryr.openstack.org/pod-finalizer') is True)
got = c.get(pod_path)
check('finalizer stored', 'kuryr.openstack.org/pod-finalizer' in got['metadata']['finalizers'])

c.annotate(pod_path, {'openstack.org/kuryr-test': 'v1'}, got['metadata']['resourceVersion'])
got = c.get(pod_path)
check('annotate with resourceVersion', got['metadata']['annotations']['openstack.org/kuryr-test'] == 'v1')

# A stale resourceVersion in a merge patch is a precondition: 409, which annotate() handles by
# re-reading and retrying with the fresh version.
url, hdr = c._get_url_and_header(pod_path, 'application/merge-patch+json')
stale = c.session.patch(url, json={'metadata': {'annotations': {'x': 'y'},
                                                'resourceVersion': pod['metadata']['resourceVersion']}},
                        headers=hdr)
check('stale resourceVersion precondition answers 409', stale.status_code == 409)
ann = c.annotate(pod_path, {'openstack.org/kuryr-test': 'v2'}, pod['metadata']['resourceVersion'])
check('annotate recovers from the conflict', ann.get('openstack.org/kuryr-test') == 'v2')

t.join(timeout=10)
check('watch streams ADDED then MODIFIED', events[:1] == [('ADDED', 'p1')] and len(events) >= 2
      and events[1][0] == 'MODIFIED')

kp_path = f'/apis/openstack.org/v1/namespaces/{NS}/kuryrports'
kp = c.post(kp_path, {
    'apiVersion': 'openstack.org/v1', 'kind': 'KuryrPort',
    'metadata': {'name': 'p1', 'finalizers': ['kuryr.openstack.org/kuryrport-finalizer'],
                 'labels': {'kuryr.openstack.org/nodeName': 'node-1'}},
    'spec': {'podUid': pod['metadata']['uid'], 'podNodeName': 'node-1'},
    'status': {'vifs': {}}})
check('post KuryrPort with status, as upstream does', kp.get('status') == {'vifs': {}})
vif = {'versioned_object.name': 'VIFOpenVSwitch', 'versioned_object.namespace': 'os_vif',
       'versioned_object.version': '1.0', 'versioned_object.data': {'id': 'port-1', 'active': True}}
c.patch_crd('status', f'{kp_path}/p1', {'vifs': {'eth0': {'default': True, 'vif': vif}}})
kp = c.get(f'{kp_path}/p1')
check('patch_crd status through the main resource',
      kp['status']['vifs']['eth0']['vif']['versioned_object.data']['id'] == 'port-1')

ev = c.add_event(got, 'KuryrTest', 'from upstream client', 'Warning')
check('add_event', ev.get('reason') == 'KuryrTest')
evs = c.get(f'/api/v1/namespaces/{NS}/events')
check('event listed', any(e.get('reason') == 'KuryrTest' for e in evs['items']))

try:
    c.get(f'/api/v1/namespaces/{NS}/pods/missing')
    nf = False
except exc.K8sResourceNotFound:
    nf = True
check('404 maps to K8sResourceNotFound', nf)

c.delete(pod_path)
got = c.get(pod_path)
check('delete with a finalizer sets deletionTimestamp', got['metadata'].get('deletionTimestamp'))
check('remove_finalizer', c.remove_finalizer(got, 'kuryr.openstack.org/pod-finalizer') is True)
try:
    c.get(pod_path)
    gone = False
except exc.K8sResourceNotFound:
    gone = True
check('pod gone once the last finalizer is removed', gone)
print(f"OK {checks} checks")
