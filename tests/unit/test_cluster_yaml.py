"""Offline checks of cluster.yaml: no AWS credentials, no network, no ray.init.

How the validation works:
1. `jsonschema.validate(raw_yaml, ray/autoscaler/ray-schema.json)` on the file as written. This must come first:
   Ray's own preparation fills missing top-level keys from ray/autoscaler/aws/defaults.yaml, so after it a missing
   `cluster_name` (or `max_workers`, or `setup_commands`) is silently replaced by Ray's default and no longer caught.
2. `ray.autoscaler._private.util.prepare_config(copy)` then `validate_config(prepared)`: what `ray up` does before it
   touches the cloud (merge with the provider's defaults.yaml, merge setup commands, fill per-node-type worker
   limits, schema again, head_node_type among available_node_types, sum of min_workers <= max_workers). For
   `provider.type: aws` prepare_config only reads defaults.yaml from the wheel: everything that needs boto3 and
   credentials (IAM role, key pair, subnets, security group, AMI) is in `bootstrap_aws`, which `ray up` calls later
   and which these tests never call. The `offline` fixture makes boto3/botocore unimportable and sockets unusable to
   prove it.
3. Project checks Ray cannot make: the pins installed by setup_commands equal pyproject.toml's, torch is installed
   first, no key is inherited from Ray's defaults, no secrets, port 5000 (MLflow) is not opened to the internet.
"""

import copy
import json
import re
import shlex
import socket
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO / "cluster.yaml"
PYPROJECT = REPO / "pyproject.toml"
CLUSTER_DOC = REPO / "docs" / "cluster.md"
RAY_AUTOSCALER_DIR = Path(ray.autoscaler.__file__).parent
SCHEMA = json.loads((RAY_AUTOSCALER_DIR / "ray-schema.json").read_text())
AWS_DEFAULTS = yaml.safe_load((RAY_AUTOSCALER_DIR / "aws" / "defaults.yaml").read_text())

# Packages whose version on the cluster must equal pyproject.toml's.
PINNED = ("torch", "ray", "mlflow")
MLFLOW_PORT = 5000
# EC2 create_instances parameters this project may use in a node_config. Ray's schema accepts any key there, so a
# typo ("InstanceTyp") would only surface at launch time. SubnetIds (plural) is Ray's own key.
NODE_CONFIG_KEYS = {
    "InstanceType",
    "ImageId",
    "BlockDeviceMappings",
    "IamInstanceProfile",
    "InstanceMarketOptions",
    "KeyName",
    "SubnetIds",
    "SecurityGroupIds",
    "TagSpecifications",
    "LaunchTemplate",
    "NetworkInterfaces",
    "Placement",
}
SECRET_PATTERNS = (
    re.compile(r"aws_access_key_id", re.IGNORECASE),
    re.compile(r"aws_secret_access_key", re.IGNORECASE),
    re.compile(r"aws_session_token", re.IGNORECASE),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # access key ids (long-term / temporary)
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
)


# ---------------------------------------------------------------------------------------------------------------
# Helpers (each one is exercised on the real file and on a broken copy)
# ---------------------------------------------------------------------------------------------------------------


def load_cluster_config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def validate_offline(raw: dict) -> dict:
    """Validate as `ray up` would before contacting AWS; return Ray's prepared config."""
    jsonschema.validate(raw, SCHEMA)  # on the raw file: Ray's defaults would hide missing keys (see module doc)
    prepared = prepare_config(copy.deepcopy(raw))  # prepare_config mutates its argument
    validate_config(prepared)
    return prepared


def inherited_keys(raw: dict) -> set[str]:
    """Top-level keys that would silently come from Ray's aws/defaults.yaml instead of our file."""
    return set(AWS_DEFAULTS) - set(raw)


def setup_command_pins(raw: dict) -> dict[str, Requirement]:
    """`name==version` requirements installed by the raw config's setup commands, by canonical name."""
    commands = [
        *raw.get("setup_commands", []),
        *raw.get("head_setup_commands", []),
        *raw.get("worker_setup_commands", []),
    ]
    pins = {}
    for command in commands:
        if "pip install" not in command:
            continue
        for token in shlex.split(command):
            if "==" in token and not token.startswith("-"):
                requirement = Requirement(token)
                pins[canonicalize_name(requirement.name)] = requirement
    return pins


def pyproject_pins() -> dict[str, Requirement]:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    requirements = [Requirement(dependency) for dependency in dependencies]
    return {canonicalize_name(r.name): r for r in requirements if any(s.operator == "==" for s in r.specifier)}


def pin_mismatches(raw: dict) -> list[str]:
    """Differences between setup_commands and pyproject.toml for the PINNED packages (version and extras)."""
    cluster, project = setup_command_pins(raw), pyproject_pins()
    problems = []
    for name in PINNED:
        if name not in project:
            problems.append(f"{name}: no '==' pin in pyproject.toml")
        elif name not in cluster:
            problems.append(f"{name}: not installed with '==' by setup_commands (pyproject has {project[name]})")
        elif (cluster[name].specifier, cluster[name].extras) != (project[name].specifier, project[name].extras):
            problems.append(f"{name}: cluster.yaml installs {cluster[name]}, pyproject.toml pins {project[name]}")
    return problems


def find_secrets(text: str) -> list[str]:
    return [match.group(0) for pattern in SECRET_PATTERNS for match in pattern.finditer(text)]


def world_open_rules(raw: dict, port: int) -> list[dict]:
    """Inbound rules of the cluster security group that admit the whole internet to `port`."""
    rules = raw.get("provider", {}).get("security_group", {}).get("IpPermissions") or []
    open_rules = []
    for rule in rules:
        protocol = str(rule.get("IpProtocol", "")).lower()
        low, high = rule.get("FromPort", -1), rule.get("ToPort", -1)
        covers_port = protocol in {"-1", "all"} or (protocol in {"tcp", "6"} and (low == -1 or low <= port <= high))
        from_anywhere = any(r.get("CidrIp") == "0.0.0.0/0" for r in rule.get("IpRanges", [])) or any(
            r.get("CidrIpv6") == "::/0" for r in rule.get("Ipv6Ranges", [])
        )
        if covers_port and from_anywhere:
            open_rules.append(rule)
    return open_rules


def mlflow_server_args(raw: dict) -> dict[str, str]:
    """Options of the `mlflow server` command started by head_start_ray_commands."""
    for command in raw.get("head_start_ray_commands", []):
        tokens = shlex.split(command)
        if "mlflow" in [Path(t).name for t in tokens] and "server" in tokens:
            options = tokens[tokens.index("server") + 1 :]
            return dict(zip(options[::2], options[1::2], strict=True))
    return {}


# ---------------------------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def raw() -> dict:
    return load_cluster_config()


@pytest.fixture
def offline(monkeypatch):
    """Make any attempt to reach AWS fail loudly: boto3/botocore unimportable, no socket connections."""
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setitem(sys.modules, "botocore", None)

    def refuse(*args, **kwargs):
        raise AssertionError(f"cluster.yaml validation tried to open a connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# ---------------------------------------------------------------------------------------------------------------
# (a) + (b): Ray's schema and Ray's own preparation/validation
# ---------------------------------------------------------------------------------------------------------------


def test_cluster_yaml_passes_ray_schema_and_ray_validation_offline(raw, offline):
    prepared = validate_offline(raw)
    node_types = prepared["available_node_types"]
    head = node_types[prepared["head_node_type"]]
    workers = {name: t for name, t in node_types.items() if name != prepared["head_node_type"]}
    assert prepared["provider"]["type"] == "aws"
    assert head["max_workers"] == 0, "the head node type should not be scaled"
    assert workers, "there must be a worker node type"
    for name, worker in workers.items():
        assert worker["min_workers"] == 0, f"{name}: GPU workers should scale to zero when idle"
        assert 0 < worker["max_workers"] <= prepared["max_workers"], name


def test_missing_cluster_name_fails_validation(raw, offline):
    del raw["cluster_name"]
    with pytest.raises(jsonschema.ValidationError, match="cluster_name"):
        validate_offline(raw)


def test_ray_alone_fills_a_missing_cluster_name_which_is_why_the_raw_schema_check_runs_first(raw, offline):
    # Documents Ray 2.60 behaviour: prepare_config copies defaults.yaml's `cluster_name: default` into the config.
    del raw["cluster_name"]
    prepared = prepare_config(copy.deepcopy(raw))
    validate_config(prepared)
    assert prepared["cluster_name"] == "default"


@pytest.mark.parametrize(
    ("break_config", "error", "message"),
    [
        (lambda c: c.update(head_node_type="no.such.type"), ValueError, "head_node_type"),
        (lambda c: c["available_node_types"]["nre.worker.gpu"].update(min_workers=5), ValueError, "max_workers"),
        (lambda c: c.update(max_worker=4), jsonschema.ValidationError, "max_worker"),
        (
            lambda c: c["available_node_types"]["nre.worker.gpu"].pop("resources"),
            jsonschema.ValidationError,
            "resources",
        ),
        (
            lambda c: c["available_node_types"]["nre.worker.gpu"].update(resources={"GPU": 0.5}),
            jsonschema.ValidationError,
            "integer",
        ),
    ],
    ids=["unknown-head-node-type", "min-workers-above-max-workers", "top-level-typo", "no-resources", "fractional-gpu"],
)
def test_broken_copies_fail_validation(raw, offline, break_config, error, message):
    break_config(raw)
    with pytest.raises(error, match=message):
        validate_offline(raw)


def test_no_top_level_key_is_inherited_from_rays_aws_defaults(raw):
    # Missing keys are copied from ray/autoscaler/aws/defaults.yaml without a warning: a missing setup_commands
    # installs a Ray nightly wheel (ray-3.0.0.dev0) on every node, a missing max_workers becomes 2.
    assert inherited_keys(raw) == set()


def test_a_missing_setup_commands_would_silently_install_rays_nightly_wheel(raw, offline):
    del raw["setup_commands"]
    assert inherited_keys(raw) == {"setup_commands"}
    prepared = validate_offline(raw)  # Ray accepts it
    assert any("ray-3.0.0.dev0" in command for command in prepared["worker_setup_commands"])


def test_node_configs_use_known_ec2_parameters(raw):
    for name, node_type in raw["available_node_types"].items():
        unknown = set(node_type["node_config"]) - NODE_CONFIG_KEYS
        assert not unknown, f"{name}: unknown node_config keys {sorted(unknown)} (typo? see EC2 create_instances)"
    raw["available_node_types"]["nre.worker.gpu"]["node_config"]["InstanceTyp"] = "g5.xlarge"
    assert set(raw["available_node_types"]["nre.worker.gpu"]["node_config"]) - NODE_CONFIG_KEYS == {"InstanceTyp"}


def test_head_starts_ray_with_the_autoscaler_and_workers_join_it(raw):
    assert any("--autoscaling-config=~/ray_bootstrap_config.yaml" in c for c in raw["head_start_ray_commands"])
    assert any("--address=$RAY_HEAD_IP:6379" in c for c in raw["worker_start_ray_commands"])


# ---------------------------------------------------------------------------------------------------------------
# (c) the versions installed on the cluster are the ones pinned in pyproject.toml
# ---------------------------------------------------------------------------------------------------------------


def test_setup_commands_install_the_pyproject_pins(raw):
    assert pin_mismatches(raw) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"torch==2.13.0"', '"torch==2.12.0"'),
        ('"mlflow==3.17.2"', '"mlflow==3.18.0"'),
        ("ray[train,data,default]==", "ray[train,data]=="),  # the `default` extra matters (see notes/stack.md)
    ],
)
def test_a_pin_differing_from_pyproject_is_reported(raw, old, new):
    commands = raw["setup_commands"]
    assert any(old in c for c in commands), f"{old} not found in setup_commands"
    raw["setup_commands"] = [c.replace(old, new) for c in commands]
    assert len(pin_mismatches(raw)) == 1


def test_torch_is_installed_first_and_alone(raw):
    # An unpinned torch pulled in by another package's resolution picks whatever build pip likes: pin it first.
    installs = [c for c in raw["setup_commands"] if "pip install" in c]
    assert installs, "setup_commands install nothing"
    packages = [t for t in shlex.split(installs[0]) if t not in {"pip", "install"} and not t.startswith("-")]
    assert [canonicalize_name(Requirement(p).name) for p in packages] == ["torch"]


def test_the_project_is_synced_and_installed_from_the_file_mount(raw):
    assert raw["file_mounts"].get("~/nre_ray") == "."
    assert any(re.search(r"pip install -e (~|\$HOME)/nre_ray\b", c) for c in raw["setup_commands"])


# ---------------------------------------------------------------------------------------------------------------
# (d) no secrets, MLflow reachable inside the cluster only
# ---------------------------------------------------------------------------------------------------------------


def test_no_secrets_in_cluster_yaml():
    assert find_secrets(CLUSTER_YAML.read_text()) == []


def test_a_secret_would_be_found():
    fake_key_id = "AKIA" + "EXAMPLEEXAMPLE12"  # built at run time so that secret scanners ignore this file
    text = CLUSTER_YAML.read_text() + f"\n# aws_access_key_id: {fake_key_id}\n"
    assert find_secrets(text) == ["aws_access_key_id", fake_key_id]


def test_mlflow_port_is_not_open_to_the_internet(raw):
    assert world_open_rules(raw, MLFLOW_PORT) == []


@pytest.mark.parametrize(
    "rule",
    [
        {"IpProtocol": "tcp", "FromPort": 5000, "ToPort": 5000, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"IpProtocol": "tcp", "FromPort": 4000, "ToPort": 6000, "Ipv6Ranges": [{"CidrIpv6": "::/0"}]},
        {"IpProtocol": "-1", "FromPort": -1, "ToPort": -1, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
    ],
    ids=["port-5000", "ipv6-range", "all-traffic"],
)
def test_a_world_open_mlflow_rule_would_be_found(raw, rule):
    raw["provider"].setdefault("security_group", {}).setdefault("IpPermissions", []).append(rule)
    assert world_open_rules(raw, MLFLOW_PORT) == [rule]


def test_mlflow_server_on_the_head(raw):
    args = mlflow_server_args(raw)
    assert args.get("--backend-store-uri") == "sqlite:////home/ubuntu/mlflow/mlflow.db"  # absolute: four slashes
    assert args.get("--host") == "0.0.0.0", "workers on other nodes log to http://<head private ip>:5000"
    assert args.get("--port") == str(MLFLOW_PORT)
    assert args.get("--artifacts-destination", "").startswith("s3://"), "artifacts must outlive `ray down`"


# ---------------------------------------------------------------------------------------------------------------
# Placeholders are explained where users read
# ---------------------------------------------------------------------------------------------------------------


def test_every_placeholder_is_explained_in_the_docs():
    placeholders = set(re.findall(r"YOUR-[A-Z]+(?:-[A-Z]+)*", CLUSTER_YAML.read_text()))
    assert placeholders, "cluster.yaml should mark what users must fill in with YOUR-..."
    missing = {p for p in placeholders if p not in CLUSTER_DOC.read_text()}
    assert not missing, f"placeholders not explained in {CLUSTER_DOC.relative_to(REPO)}: {sorted(missing)}"
