"""Kubernetes manifests for an NVL72 rack: one LeaderWorkerSet per group (a pod per tray), an IMEX
ComputeDomain for the MNNVL fabric, and the router (Deployment + Service) behind a health gate."""

from __future__ import annotations

from typing import Any

import yaml

from k3_sglang.launch.commands import nic_pinning_env, router_command, serve_command, serving_env
from k3_sglang.launch.layout import Instance, group_names, nodes_used
from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.plan.capacity import PlanResult

LWS_API = "leaderworkerset.x-k8s.io/v1"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
CHANNEL_CLAIM = "compute-domain-channel"
MODEL_MOUNT = "/models"


def _names(result: PlanResult) -> tuple[str, str]:
    base = f"k3-{result.spec.name}"
    return base, f"{base}-compute-domain"


def compute_domain(result: PlanResult, trays: int) -> dict[str, Any]:
    """The IMEX domain every server pod joins, so NCCL and Mooncake can use MNNVL."""
    _, name = _names(result)
    return {"apiVersion": COMPUTE_DOMAIN_API, "kind": "ComputeDomain", "metadata": {"name": name},
            "spec": {"numNodes": trays, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}}}


def _container(instance: Instance, result: PlanResult, settings: LaunchSettings, leader: bool) -> dict[str, Any]:
    command = serve_command(instance, result.spec, settings.model_path, "$(LWS_WORKER_INDEX)",
                            f"$(LWS_LEADER_ADDRESS):{instance.dist_init_port}", with_gpu_offset=False)
    if instance.nnodes > 1:
        command[command.index("--nnodes") + 1] = "$(LWS_GROUP_SIZE)"
    env = {**serving_env(result.spec), **nic_pinning_env(result.spec)}
    container: dict[str, Any] = {
        "name": "k3-serve", "image": settings.image, "command": command,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"limits": {"nvidia.com/gpu": instance.gpus_per_node}, "claims": [{"name": CHANNEL_CLAIM}]},
        "volumeMounts": [{"name": "weights", "mountPath": MODEL_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if leader:
        container["ports"] = [{"name": "http", "containerPort": instance.port}]
        container["readinessProbe"] = {"httpGet": {"path": "/health", "port": instance.port},
                                       "periodSeconds": 10, "failureThreshold": 3}
        container["startupProbe"] = {"httpGet": {"path": "/health", "port": instance.port}, "periodSeconds": 10,
                                     "failureThreshold": max(1, settings.health_timeout_s // 10)}
    return container


def _pod_template(instance: Instance, result: PlanResult, settings: LaunchSettings, leader: bool) -> dict[str, Any]:
    _, domain = _names(result)
    return {"metadata": {"labels": {"app.kubernetes.io/name": "k3", "k3/role": instance.group.role}},
            "spec": {"containers": [_container(instance, result, settings, leader)],
                     "resourceClaims": [{"name": CHANNEL_CLAIM, "resourceClaimTemplateName": f"{domain}-channel"}],
                     "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": settings.model_pvc}},
                                 {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}


def leader_worker_set(name: str, instance: Instance, result: PlanResult, settings: LaunchSettings) -> dict[str, Any]:
    """All replicas of one group: `replicas` groups of `size` pods (one pod per tray)."""
    template: dict[str, Any] = {"size": instance.nnodes,
                                "leaderTemplate": _pod_template(instance, result, settings, leader=True),
                                "workerTemplate": _pod_template(instance, result, settings, leader=False)}
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": settings.namespace},
            "spec": {"replicas": instance.group.replicas, "startupPolicy": "LeaderCreated",
                     "leaderWorkerTemplate": template}}


def _leaders(sets: list[tuple[str, Instance]], settings: LaunchSettings) -> list[tuple[str, Instance]]:
    """(leader URL, the group's instance) of every replica; all replicas of a group share its ports."""
    return [(f"http://{name}-{r}.{name}.{settings.namespace}.svc.cluster.local:{inst.port}", inst)
            for name, inst in sets for r in range(inst.group.replicas)]


def _wait_script(urls: list[str], timeout_s: int) -> str:
    checks = " ".join(urls)
    return (f"deadline=$(( $(date +%s) + {timeout_s} ))\n"
            f"for url in {checks}; do\n"
            "  until curl -fsS -o /dev/null --max-time 5 \"$url/health\"; do\n"
            "    if [ \"$(date +%s)\" -ge \"$deadline\" ]; then\n"
            f"      echo \"k3-launch: error: $url/health not ready after {timeout_s}s\" >&2; exit 1\n"
            "    fi\n    sleep 10\n  done\n  echo \"k3-launch: $url healthy\"\ndone\n")


def router_manifests(base: str, leaders: list[tuple[str, Instance]], settings: LaunchSettings) -> list[dict[str, Any]]:
    """Router Deployment (an init container waits for every leader's /health) and its Service."""
    urls = [url for url, _ in leaders]
    labels = {"app.kubernetes.io/name": "k3-router", "k3/plan": base}
    pod = {"metadata": {"labels": labels},
           "spec": {"initContainers": [{"name": "wait-for-servers", "image": settings.image,
                                        "command": ["/bin/sh", "-c", _wait_script(urls, settings.health_timeout_s)]}],
                    "containers": [{"name": "k3-router", "image": settings.image,
                                    "command": router_command(leaders, settings),
                                    "ports": [{"name": "http", "containerPort": settings.router_port}]}]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": f"{base}-router", "namespace": settings.namespace},
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{base}-router", "namespace": settings.namespace},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": settings.router_port,
                                                       "targetPort": settings.router_port}]}}
    return [deployment, service]


def render_lws(result: PlanResult, instances: list[Instance], settings: LaunchSettings) -> str:
    """All manifests as one multi-document YAML file."""
    base, _ = _names(result)
    first_of_group = {}
    for name, plan in zip(group_names(result), result.groups):
        first_of_group[name] = next(i for i in instances if i.plan is plan)
    sets = [(f"{base}-{name}", inst) for name, inst in first_of_group.items()]
    docs = [compute_domain(result, nodes_used(instances))]
    docs += [leader_worker_set(name, inst, result, settings) for name, inst in sets]
    docs += router_manifests(base, _leaders(sets, settings), settings)
    header = (f"# Rendered by `k3 launch render` from plan {result.spec.name!r} on {result.spec.system.name}; "
              "re-render, do not edit.\n# Needs the LeaderWorkerSet controller and NVIDIA's DRA driver "
              "(ComputeDomain) on the cluster.\n")
    return header + yaml.safe_dump_all(docs, sort_keys=False, width=120)
