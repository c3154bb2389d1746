"""The rendered LeaderWorkerSet manifests (launch/lws.py) through a real schema validator, not a hand check.

See tests/unit/lws_schema.py: the LWS envelope schema is ours (closed, from the LWS v1 API's documented fields);
the pod templates and metadata are checked against Kubernetes' own OpenAPI schema shipped by `kubernetes-validate`
(PyPI), strict mode, newest bundled Kubernetes version. The upstream LWS CRD is not committed (fetched upstream data
may not be committed to this project). Negative controls show each part bites, at the right path, for the right
reason."""
from __future__ import annotations

import copy

import pytest
import yaml
from lws_schema import K8S_KEYWORD, KUBERNETES_VERSION, error_lines, lws_validator

from k3_sglang.launch.golden import EXAMPLES_DIR, render_example


@pytest.fixture(scope="module")
def validator():
    return lws_validator()


def _lws_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "LeaderWorkerSet"]


def _manifests() -> dict[str, str]:
    """Every rendered LWS manifest of the example presets: as committed and as the generator writes it now."""
    out = {}
    for folder in sorted(EXAMPLES_DIR.iterdir()):
        for path in sorted(folder.glob("*lws.yaml")):
            out[f"committed {path.name}"] = path.read_text()
        for name, text in render_example(folder.name).items():
            if name.endswith("lws.yaml"):
                out[f"rendered {name}"] = text
    return out


@pytest.fixture(scope="module")
def sample() -> dict:
    return _lws_docs(next(iter(_manifests().values())))[0]


def test_the_kubernetes_schema_is_the_newest_bundled_one():
    from kubernetes_validate.utils import all_versions
    assert KUBERNETES_VERSION == all_versions()[-1] and tuple(map(int, KUBERNETES_VERSION.split(".")[:2])) >= (1, 37)


def test_every_rendered_leaderworkerset_passes_the_strict_schema(validator):
    manifests = _manifests()
    assert any(k.startswith("rendered") for k in manifests), "no preset renders an LWS manifest"
    for name, text in manifests.items():
        docs = _lws_docs(text)
        assert docs, f"{name}: no LeaderWorkerSet"
        for doc in docs:
            errors = error_lines(validator, doc)
            assert not errors, f"{name} {doc['metadata']['name']}:\n" + "\n".join(errors[:10])
            template = doc["spec"]["leaderWorkerTemplate"]
            assert template["size"] >= 2, f"{name}: a multi-node group renders size {template['size']}"
            assert {"leaderTemplate", "workerTemplate"} <= set(template), "both pod templates are rendered"


_LWT = ("spec", "leaderWorkerTemplate")
_WORKER_C0 = (*_LWT, "workerTemplate", "spec", "containers", 0)
_LEADER_C0 = (*_LWT, "leaderTemplate", "spec", "containers", 0)


def _at(doc: dict, path: tuple) -> dict:
    for key in path:
        doc = doc[key]
    return doc


# (mutation, path of the error, JSON-schema keyword that fails there, text the message must hold)
CONTROLS = {
    # our envelope schema
    "size is a string": (lambda d: _at(d, _LWT).__setitem__("size", "two"), (*_LWT, "size"), "type", "integer"),
    "size 0": (lambda d: _at(d, _LWT).__setitem__("size", 0), (*_LWT, "size"), "minimum", "minimum of 1"),
    "misspelt size": (lambda d: _at(d, _LWT).__setitem__("sizee", 2), _LWT, "additionalProperties", "'sizee'"),
    "negative replicas": (lambda d: d["spec"].__setitem__("replicas", -1), ("spec", "replicas"), "minimum", "-1"),
    "unknown startupPolicy": (lambda d: d["spec"].__setitem__("startupPolicy", "LeaderFirst"),
                              ("spec", "startupPolicy"), "enum", "LeaderFirst"),
    "wrong apiVersion": (lambda d: d.__setitem__("apiVersion", "leaderworkerset.x-k8s.io/v1alpha1"),
                         ("apiVersion",), "const", "'leaderworkerset.x-k8s.io/v1' was expected"),
    "no workerTemplate": (lambda d: _at(d, _LWT).pop("workerTemplate"), _LWT, "required", "'workerTemplate'"),
    # Kubernetes' schema (kubernetes-validate, strict) inside the pod templates and metadata
    "container without name": (lambda d: _at(d, _WORKER_C0).pop("name"), _WORKER_C0, K8S_KEYWORD,
                               "'name' is a required property"),
    "misspelt env field": (lambda d: _at(d, _WORKER_C0)["env"][0].__setitem__("valeu", "x"),
                           (*_WORKER_C0, "env", 0), K8S_KEYWORD, "'valeu' was unexpected"),
    "env value not a string": (lambda d: _at(d, _LEADER_C0)["env"][0].__setitem__("value", 8),
                               (*_LEADER_C0, "env", 0, "value"), K8S_KEYWORD, "is not of type 'string'"),
    "misspelt volumeMounts": (lambda d: _at(d, _WORKER_C0).__setitem__("volumeMount", []), _WORKER_C0, K8S_KEYWORD,
                              "'volumeMount' was unexpected"),
    "containerPort a string": (lambda d: _at(d, _LEADER_C0)["ports"][0].__setitem__("containerPort", "http"),
                               (*_LEADER_C0, "ports", 0, "containerPort"), K8S_KEYWORD, "is not of type 'integer'"),
    "misspelt metadata field": (lambda d: d["metadata"].__setitem__("label", {"a": "b"}), ("metadata",), K8S_KEYWORD,
                                "'label' was unexpected"),
}


@pytest.mark.parametrize("control", list(CONTROLS))
def test_the_validator_rejects_broken_manifests_for_the_right_reason(validator, sample, control):
    mutate, path, keyword, text = CONTROLS[control]
    doc = copy.deepcopy(sample)
    assert not error_lines(validator, doc)
    mutate(doc)
    errors = list(validator.iter_errors(doc))
    assert errors, f"{control}: accepted"
    hits = [e for e in errors if tuple(e.absolute_path) == path and e.validator == keyword and text in e.message]
    assert hits, f"{control}: expected {keyword} at {'/'.join(map(str, path))} with {text!r}, got:\n" + "\n".join(
        f"{e.validator} at {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    if keyword == K8S_KEYWORD:
        assert f"Kubernetes {KUBERNETES_VERSION.rsplit('.', 1)[0]}" in hits[0].message
