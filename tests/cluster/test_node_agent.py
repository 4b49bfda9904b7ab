"""The test node agent (tests/fixtures/node_agent.py, a kubelet test double) against the real apiserver and
controllers: pods really run, their status is real, the endpoints controller and the Deployment see it."""
import json
import sys
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sits.control_plane.adapters.deploy.local import process
from tests.cluster.support import container_status, pid_alive, pod
from tests.waiting import wait_for
from tests.fixtures.kube_proxy import ServiceLoadBalancer


@pytest.fixture
def core(kube_cluster):
    return client.CoreV1Api(kube_cluster.api_client())


@pytest.fixture
def apps(kube_cluster):
    return client.AppsV1Api(kube_cluster.api_client())


def engine_deployment(name: str, port: int, replicas: int) -> dict:
    probe = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 2, "failureThreshold": 3}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{
                         "name": "engine", "image": "registry.local/sits-engine:1", "command": ["sits-engine"],
                         "args": ["serve", "--model", "tiny", "--host", "0.0.0.0", "--port", str(port)],
                         "ports": [{"name": "http", "containerPort": port}], "readinessProbe": probe}]}}}}


def test_node_registered_ready_with_gpu_capacity(core, node_agent):
    node = core.read_node("local-0")
    assert node.status.capacity["nvidia.com/gpu"] == "2"
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]


def test_deployment_becomes_ready_endpoints_list_pod_ips_and_pods_answer(core, apps, agent_namespace, kube_cluster):
    ns, port = agent_namespace, process.free_port()
    apps.create_namespaced_deployment(ns, engine_deployment("eng", port, replicas=2))
    core.create_namespaced_service(ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "eng"},
                                        "spec": {"selector": {"app": "eng"},
                                                 "ports": [{"port": 80, "targetPort": "http"}]}})
    wait_for("Deployment eng ready",
             lambda: (apps.read_namespaced_deployment("eng", ns).status.ready_replicas or 0) == 2, timeout=60)
    pods = core.list_namespaced_pod(ns, label_selector="app=eng").items
    ips = sorted(p.status.pod_ip for p in pods)
    assert len(set(ips)) == 2 and all(ip.startswith("127.0.1.") for ip in ips)
    assert all(p.spec.node_name == "local-0" and p.status.phase == "Running" for p in pods)
    # the real EndpointSlice controller turned the Ready pods into the Service's endpoints
    lb = ServiceLoadBalancer(kube_cluster.api_client(), ns, "eng")
    assert wait_for("EndpointSlice eng", lambda: lb.endpoints() == [(ip, port) for ip in ips] and lb.endpoints())
    for ip in ips:  # both pods bound 0.0.0.0:port, each got its own address
        body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()
        req = urllib.request.Request(f"http://{ip}:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and json.loads(r.read())["choices"]


def test_exiting_container_is_restarted_with_backoff(core, agent_namespace, node_agent):
    ns = agent_namespace
    core.create_namespaced_pod(ns, pod("crash", ["sh", "-c", "echo started; exit 3"]))
    st = wait_for("two restarts, then back-off", lambda: (s := container_status(core, ns, "crash")).get(
        "restartCount", 0) >= 2 and s["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff" and s)
    assert st["lastState"]["terminated"]["exitCode"] == 3
    assert st["lastState"]["terminated"]["reason"] == "Error"
    assert not st["ready"]
    p = core.read_namespaced_pod("crash", ns)
    assert p.status.phase == "Running"   # restartPolicy Always: never Failed
    assert {c.type: c.status for c in p.status.conditions}["Ready"] == "False"
    assert node_agent.logs(ns, "crash").count("started") >= 3


def test_pod_logs_through_the_apiserver_from_the_agents_log_endpoint(core, agent_namespace, node_agent):
    """kube-apiserver's pods/log proxy reaches the agent's kubelet endpoint (HTTPS at the Node's InternalIP and
    daemonEndpoints port): the current run, tailLines, limitBytes, previous, and the kubelet's errors."""
    ns = agent_namespace
    assert core.read_node("local-0").status.daemon_endpoints.kubelet_endpoint.port == node_agent.log_server.port
    core.create_namespaced_pod(ns, pod("talk", ["sh", "-c", 'echo "run $$"; echo one; echo two; printf three; '
                                                             'sleep 0.5; exit 1']))
    prev = wait_for("a restart", lambda: container_status(core, ns, "talk").get("restartCount", 0) >= 1 and
                    core.read_namespaced_pod_log("talk", ns, previous=True))
    assert prev.startswith("run ") and prev.endswith("one\ntwo\nthree") and prev.count("run ") == 1
    assert core.read_namespaced_pod_log("talk", ns, tail_lines=2, previous=True) == "two\nthree"
    assert core.read_namespaced_pod_log("talk", ns, limit_bytes=3, previous=True) == "run"
    # the file keeps every run, the endpoint one; the restart is counted when the new run starts, which may not have
    # printed yet (seen once under CI's load): wait for its line
    wait_for("the second run in the agent's log file", lambda: node_agent.logs(ns, "talk").count("run ") >= 2)
    with pytest.raises(ApiException) as e:   # validated by the apiserver against the pod's spec
        core.read_namespaced_pod_log("talk", ns, container="nope")
    assert e.value.status == 400 and "container nope is not valid" in e.value.body
    core.create_namespaced_pod(ns, pod("fresh", ["sh", "-c", "echo hi; sleep 300"]))
    wait_for("fresh started", lambda: container_status(core, ns, "fresh").get("state", {}).get("running"))
    with pytest.raises(ApiException) as e:   # the kubelet's own answer, relayed
        core.read_namespaced_pod_log("fresh", ns, previous=True)
    assert e.value.status == 400
    assert json.loads(e.value.body)["message"] == 'previous terminated container "main" in pod "fresh" not found'
    assert wait_for("hi logged", lambda: core.read_namespaced_pod_log("fresh", ns) == "hi\n")


def test_restart_policy_never_fails_the_pod(core, agent_namespace):
    ns = agent_namespace
    body = pod("never", ["sh", "-c", "exit 7"])
    body["spec"]["restartPolicy"] = "Never"
    core.create_namespaced_pod(ns, body)
    wait_for("pod never Failed", lambda: core.read_namespaced_pod("never", ns).status.phase == "Failed")
    st = container_status(core, ns, "never")
    assert st["restartCount"] == 0 and st["state"]["terminated"]["exitCode"] == 7


def test_delete_sends_sigterm_then_the_pod_object_goes(core, agent_namespace, node_agent, tmp_path):
    ns = agent_namespace
    vol = [{"name": "out", "hostPath": {"path": str(tmp_path)}}]
    # "up" once the trap is set: a SIGTERM before that would end the shell by default (CI once deleted it sooner)
    cmd = ["sh", "-c", "trap 'echo TERM > /out/term; exit 0' TERM; echo up > /out/up; while :; do sleep 0.1; done"]
    core.create_namespaced_pod(ns, pod("graceful", cmd, volumes=vol, mounts=[{"name": "out", "mountPath": "/out"}]))
    pids = wait_for("graceful running", lambda: (w := node_agent.worker(ns, "graceful")) and w.pids())
    wait_for("the trap set", lambda: (tmp_path / "up").exists())
    wait_for("status Running", lambda: core.read_namespaced_pod("graceful", ns).status.phase == "Running")
    core.delete_namespaced_pod("graceful", ns)
    wait_for("pod object deleted", lambda: _gone(core, ns, "graceful"))
    assert (tmp_path / "term").read_text() == "TERM\n"
    assert not any(pid_alive(p) for p in pids)


def test_process_ignoring_sigterm_is_killed_after_the_grace_period(core, agent_namespace, node_agent):
    ns = agent_namespace
    core.create_namespaced_pod(ns, pod("stubborn", ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"], grace=1))
    pids = wait_for("stubborn running", lambda: (w := node_agent.worker(ns, "stubborn")) and w.pids())
    wait_for("status Running", lambda: core.read_namespaced_pod("stubborn", ns).status.phase == "Running")
    core.delete_namespaced_pod("stubborn", ns)
    wait_for("pod object deleted", lambda: _gone(core, ns, "stubborn"))
    assert not any(pid_alive(p) for p in pids)


def test_volumes_env_and_service_account_token_in_a_private_mount_namespace(core, agent_namespace, kube_cluster,
                                                                             tmp_path):
    ns = agent_namespace
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"mode": "fast", "a.yaml": "x: 1"}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "sec"}, "stringData": {"password": "s3cret"}})
    script = ("import json, os, pathlib; sa = '/var/run/secrets/kubernetes.io/serviceaccount'; "
              "out = {k: os.environ.get(k) for k in ('MY_IP', 'MY_NAME', 'PASSWORD', 'MODE', 'URL', "
              "'KUBERNETES_SERVICE_HOST', 'KUBERNETES_SERVICE_PORT')}; "
              "out['files'] = {p: pathlib.Path(p).read_text() for p in ('/etc/cfg/a.yaml', '/etc/sec/password', "
              "sa + '/namespace')}; out['token'] = pathlib.Path(sa + '/token').read_text(); "
              "out['ca'] = pathlib.Path(sa + '/ca.crt').read_text(); "
              "pathlib.Path('/out/env.json').write_text(json.dumps(out))")
    env = [{"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
           {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
           {"name": "URL", "value": "http://$(MY_IP):1/$(MODE)"}]
    vols = [{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "sec", "secret": {"secretName": "sec"}},
            {"name": "out", "hostPath": {"path": str(tmp_path)}}]
    mounts = [{"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True},
              {"name": "sec", "mountPath": "/etc/sec", "readOnly": True}, {"name": "out", "mountPath": "/out"}]
    body = pod("envy", [sys.executable, "-c", script], volumes=vols, mounts=mounts, env=env)
    body["spec"]["restartPolicy"] = "Never"
    core.create_namespaced_pod(ns, body)
    wait_for("pod Succeeded", lambda: core.read_namespaced_pod("envy", ns).status.phase == "Succeeded")
    out = json.loads((tmp_path / "env.json").read_text())
    ip = core.read_namespaced_pod("envy", ns).status.pod_ip
    assert out["MY_IP"] == ip and out["MY_NAME"] == "envy" and out["PASSWORD"] == "s3cret" and out["MODE"] == "fast"
    assert out["URL"] == f"http://{ip}:1/fast"
    assert out["files"] == {"/etc/cfg/a.yaml": "x: 1", "/etc/sec/password": "s3cret",
                            "/var/run/secrets/kubernetes.io/serviceaccount/namespace": ns}
    assert f"https://{out['KUBERNETES_SERVICE_HOST']}:{out['KUBERNETES_SERVICE_PORT']}" == kube_cluster.server
    assert out["ca"] == open(kube_cluster.ca_file).read()
    # the mounted token is the namespace's default ServiceAccount's: authenticated, but granted nothing
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(kube_cluster.api_client(out["token"])).list_namespaced_secret(ns)
    assert e.value.status == 403 and f"system:serviceaccount:{ns}:default" in e.value.body
    # the mounts were private to the pod: the host's paths are empty
    assert not list(__import__("pathlib").Path("/etc/cfg").glob("*"))


def test_pod_asking_more_gpus_than_the_node_has_is_unschedulable(core, agent_namespace):
    ns = agent_namespace
    core.create_namespaced_pod(ns, pod("greedy", ["sleep", "100"],
                                       resources={"limits": {"nvidia.com/gpu": "3"}}))
    cond = wait_for("PodScheduled False", lambda: [c for c in core.read_namespaced_pod("greedy", ns).status.conditions
                                                   or [] if c.type == "PodScheduled" and c.status == "False"])
    assert cond[0].reason == "Unschedulable" and "Insufficient nvidia.com/gpu" in cond[0].message
    assert core.read_namespaced_pod("greedy", ns).spec.node_name is None


def _gone(core, ns, name) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except ApiException as e:
        return e.status == 404
    return False


def test_probes_gate_readiness_and_restart_on_liveness_failure(core, agent_namespace, kube_cluster, tmp_path):
    ns, port = agent_namespace, process.free_port()
    (tmp_path / "ready").touch()
    (tmp_path / "alive").touch()
    body = pod("probed", [sys.executable, "-m", "http.server", "--bind", "0.0.0.0", str(port)],
               volumes=[{"name": "out", "hostPath": {"path": str(tmp_path)}}],
               mounts=[{"name": "out", "mountPath": "/probe"}],
               ports=[{"name": "web", "containerPort": port}],
               startupProbe={"tcpSocket": {"port": "web"}, "periodSeconds": 1, "failureThreshold": 30},
               readinessProbe={"exec": {"command": ["test", "-f", "/probe/ready"]}, "periodSeconds": 1},
               livenessProbe={"exec": {"command": ["test", "-f", "/probe/alive"]}, "periodSeconds": 1,
                              "failureThreshold": 2})
    core.create_namespaced_pod(ns, body)
    core.create_namespaced_service(ns, {"metadata": {"name": "probed"}, "spec": {
        "selector": {"app": "probed"}, "ports": [{"port": 80, "targetPort": "web"}]}})
    lb = ServiceLoadBalancer(kube_cluster.api_client(), ns, "probed", refresh_s=0)
    ip = wait_for("ready endpoint", lambda: lb.endpoints() and lb.endpoints()[0][0])
    _, status, _ = lb.request("/")
    assert status == 200 and container_status(core, ns, "probed")["ready"]
    (tmp_path / "ready").unlink()   # the exec readiness probe fails: NotReady, out of the Service
    wait_for("not ready", lambda: not container_status(core, ns, "probed")["ready"] and not lb.endpoints())
    assert container_status(core, ns, "probed")["restartCount"] == 0   # readiness never restarts
    (tmp_path / "ready").touch()
    assert wait_for("ready again", lambda: lb.endpoints()) == [(ip, port)]
    (tmp_path / "alive").unlink()   # liveness fails twice: the container is killed (SIGTERM) and restarted
    st = wait_for("restarted", lambda: (s := container_status(core, ns, "probed"))["restartCount"] >= 1 and s)
    assert st["lastState"]["terminated"]["exitCode"] == 143 and st["lastState"]["terminated"]["signal"] == 15
    (tmp_path / "alive").touch()
    wait_for("ready after the restart", lambda: container_status(core, ns, "probed")["ready"] and lb.endpoints())


def test_projected_service_account_token_from_the_token_request_api(core, agent_namespace, kube_cluster, tmp_path):
    ns = agent_namespace
    core.create_namespaced_config_map(ns, {"metadata": {"name": "ca"}, "data": {"ca.crt": "CA"}})
    vol = {"name": "kube-api", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}
    script = ("import pathlib, shutil; shutil.copytree('/var/run/secrets/kubernetes.io/serviceaccount', "
              "'/out/sa', dirs_exist_ok=True)")
    body = pod("projected", [sys.executable, "-c", script],
               volumes=[vol, {"name": "out", "hostPath": {"path": str(tmp_path)}}],
               mounts=[{"name": "kube-api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": True}, {"name": "out", "mountPath": "/out"}])
    body["spec"].update(restartPolicy="Never", automountServiceAccountToken=False)
    core.create_namespaced_pod(ns, body)
    wait_for("pod Succeeded", lambda: core.read_namespaced_pod("projected", ns).status.phase == "Succeeded")
    sa = tmp_path / "sa"
    assert sorted(p.name for p in sa.iterdir()) == ["ca.crt", "namespace", "token"]
    assert (sa / "ca.crt").read_text() == "CA" and (sa / "namespace").read_text() == ns
    token = (sa / "token").read_text()
    with pytest.raises(ApiException) as e:   # a bound token of the default ServiceAccount: authenticated, no grants
        client.CoreV1Api(kube_cluster.api_client(token)).list_namespaced_secret(ns)
    assert e.value.status == 403 and f"system:serviceaccount:{ns}:default" in e.value.body


def test_stopping_the_agent_kills_every_pod_process(core, kube_cluster, kube_namespace, tmp_path):
    from tests.fixtures.node_agent import NodeAgent
    ns = kube_namespace
    wait_for("default token", lambda: core.read_namespaced_service_account("default", ns).secrets)
    with NodeAgent(kube_cluster, tmp_path, node_name="local-stop", time_scale=0.2) as agent:
        agent.manage(ns)
        # a child process in the container's group, and one that ignores SIGTERM
        core.create_namespaced_pod(ns, pod("tree", ["sh", "-c",
                                                    "trap '' TERM; sleep 300 & while :; do sleep 0.1; done"]))
        pids = wait_for("tree running", lambda: (w := agent.worker(ns, "tree")) and w.pids())
        children = wait_for("the sleep child", lambda: [int(p) for p in open(f"/proc/{pids[0]}/task/{pids[0]}/children")
                                                        .read().split()])
    # SIGKILL is delivered asynchronously: on a loaded machine the orphaned `sleep 300` can take a moment to exit
    # (it would live 300 s if the agent had not killed the group)
    wait_for("every pod process gone", lambda: not any(pid_alive(p) for p in pids + children), timeout=10)
