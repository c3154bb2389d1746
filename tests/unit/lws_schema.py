"""A strict validator for the LeaderWorkerSet manifests that launch/lws.py renders.

Two schemas, two owners:
- The LeaderWorkerSet envelope (apiVersion, kind, spec.replicas, spec.leaderWorkerTemplate.size/restartPolicy/...,
  startupPolicy, rolloutStrategy, networkConfig) is OUR schema, `ENVELOPE` below, written by hand from the field
  names, types and enum values of the LWS v1 API reference (kubernetes-sigs/lws, leaderworkerset.x-k8s.io/v1). It is
  closed: every object has `additionalProperties: false`, so a misspelt field fails as it would under
  `kubectl apply --validate=strict`. It covers the LWS v1 fields only, not every CRD-level default or CEL rule.
- The pod templates (leaderTemplate, workerTemplate) and the object's metadata are checked against KUBERNETES' own
  OpenAPI schema as shipped by `kubernetes-validate` (PyPI), strict mode (unknown fields rejected), at its newest
  bundled Kubernetes version: each template is validated as the `template` of a core v1 `PodTemplate`, and the
  metadata as that PodTemplate's `metadata` (an ObjectMeta). The envelope marks those spots with the keyword
  `x-k3-kubernetes`; the validator below runs kubernetes-validate there and reports its error at the manifest path.

Why the upstream LWS CRD schema is not committed: data fetched from upstream repositories may not be committed to
this project. If a copy of the CRD is ever provided under ../shared/, the envelope could be checked against it too.
"""
from __future__ import annotations

from collections import deque

import jsonschema
import kubernetes_validate

KUBERNETES_VERSION = kubernetes_validate.latest_version()
K8S_KEYWORD = "x-k3-kubernetes"
_K8S_SLOTS = {"template": "PodTemplateSpec", "metadata": "ObjectMeta"}

_INT32 = {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1}
_INT_OR_PERCENT = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": r"^[0-9]+%$"}]}


def _closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


POD_TEMPLATE_SPEC = {K8S_KEYWORD: "template"}
OBJECT_META = {K8S_KEYWORD: "metadata"}

ENVELOPE = _closed({
    "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
    "kind": {"const": "LeaderWorkerSet"},
    "metadata": OBJECT_META,
    "spec": _closed({
        "replicas": {**_INT32, "minimum": 0},
        "leaderWorkerTemplate": _closed({
            "leaderTemplate": POD_TEMPLATE_SPEC,
            "workerTemplate": POD_TEMPLATE_SPEC,
            "size": {**_INT32, "minimum": 1},
            "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None"]},
            "subGroupPolicy": _closed({
                "subGroupPolicyType": {"enum": ["LeaderWorker", "LeaderExcluded"]},
                "subGroupSize": {**_INT32, "minimum": 1},
            }, required=("subGroupSize",)),
            "volumeClaimTemplates": {"type": "array", "items": {"type": "object"}},
            "persistentVolumeClaimRetentionPolicy": _closed({
                "whenDeleted": {"enum": ["Retain", "Delete"]},
                "whenScaled": {"enum": ["Retain", "Delete"]},
            }),
        }, required=("workerTemplate",)),
        "rolloutStrategy": _closed({
            "type": {"const": "RollingUpdate"},
            "rollingUpdateConfiguration": _closed({
                "partition": {**_INT32, "minimum": 0},
                "maxUnavailable": _INT_OR_PERCENT,
                "maxSurge": _INT_OR_PERCENT,
            }),
        }, required=("type",)),
        "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
        "networkConfig": _closed({"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}},
                                 required=("subdomainPolicy",)),
        "groupIdentity": {"enum": ["Ordinal", "Hash"]},
    }, required=("leaderWorkerTemplate",)),
}, required=("apiVersion", "kind", "metadata", "spec"))


def _kubernetes_schema(validator, slot: str, instance, schema):
    """`x-k3-kubernetes: <slot>`: the instance, put at `slot` of a core v1 PodTemplate, must pass Kubernetes' strict
    schema. The error comes back with its path below the instance (the PodTemplate wrapper stripped)."""
    wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "k3-schema-check"}, slot: instance}
    try:
        kubernetes_validate.validate(wrapper, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        inner = list(err.path)
        yield jsonschema.ValidationError(
            f"Kubernetes {err.version} {_K8S_SLOTS[slot]} (strict): {err.message}",
            path=deque(inner[1:] if inner[:1] == [slot] else inner), cause=err)


LwsValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {K8S_KEYWORD: _kubernetes_schema})


def lws_validator() -> jsonschema.protocols.Validator:
    """The validator for one rendered LeaderWorkerSet document; `iter_errors(doc)` lists every problem."""
    jsonschema.Draft202012Validator.check_schema(ENVELOPE)
    return LwsValidator(ENVELOPE)


def error_lines(validator, doc: dict) -> list[str]:
    """'<path>: <message>' for each error, path as slash-joined keys from the document root."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
