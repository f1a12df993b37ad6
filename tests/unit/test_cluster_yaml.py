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
3. Project checks Ray cannot make: the pins installed by setup_commands equal constraints.txt's (the default
   install's known-good set, inside pyproject.toml's ranges), torch is installed
   first, no key is inherited from Ray's defaults, no secrets, port 5000 (MLflow) is not opened to the internet.
4. Least privilege for the GPU workers: no worker node type gets the autoscaler's own instance profile, and the IAM
   commands in docs/cluster.md (valid bash; their policy documents valid JSON) grant the workers' role S3 objects
   under the project prefix only and the head iam:PassRole on that role only; README.md links to it.
5. Spot: a spot GPU worker type that is the on-demand one plus `InstanceMarketOptions`, the autoscaler's choice
   between the two as docs/cluster.md states it (Ray's own scheduling function), and the spot watcher started on
   every worker after `ray start`, with arguments its own parser accepts.
"""

import copy
import functools
import json
import re
import shlex
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer, get_nodes_for
from ray.autoscaler._private.util import prepare_config, validate_config

from nre_ray.cluster import spot_watch

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO / "cluster.yaml"
PYPROJECT = REPO / "pyproject.toml"
CONSTRAINTS = REPO / "constraints.txt"
CLUSTER_DOC = REPO / "docs" / "cluster.md"
README = REPO / "README.md"
CLUSTER_SECTION = "## Run on a cluster (AWS)"
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
# IAM: the instance profile `ray up` creates for the head (EC2 + S3 full access) and the one docs/cluster.md creates for
# the GPU workers. BUCKET and ACCOUNT are the shell variables of the doc's IAM commands; the tests expand them to the
# cluster.yaml placeholders.
AUTOSCALER_PROFILE = "ray-autoscaler-v1"
WORKER_ROLE = "nre-ray-worker"
DOC_VARIABLES = {"BUCKET": "YOUR-BUCKET", "ACCOUNT": "YOUR-ACCOUNT-ID"}
PROJECT_PREFIX = "nre_ray/"
# S3 actions on objects (resource arn:aws:s3:::bucket/key) and on the bucket itself (arn:aws:s3:::bucket).
S3_BUCKET_ACTIONS = {"s3:ListBucket"}
SECRET_PATTERNS = (
    re.compile(r"aws_access_key_id", re.IGNORECASE),
    re.compile(r"aws_secret_access_key", re.IGNORECASE),
    re.compile(r"aws_session_token", re.IGNORECASE),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # access key ids (long-term / temporary)
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    # Ray's token or MLflow's passwords given as a value (reading one from a file, "$(cat FILE)", is how they come)
    re.compile(r"\b(?:RAY_AUTH_TOKEN|MLFLOW_TRACKING_PASSWORD|MLFLOW_AUTH_ADMIN_PASSWORD|MLFLOW_TRACKING_TOKEN)"
               r"""=(?!["']?\$\(cat )\S+"""),
    re.compile(r"^\s*admin_password\s*=\s*\S+", re.IGNORECASE | re.MULTILINE),  # MLflow's auth settings (ini)
    re.compile(r"\b[0-9a-f]{32,}\b"),  # a token such as `ray get-auth-token --generate` prints (64 hex digits)
)
#: Where file_mounts puts the secrets on every node, and the files there (docs/cluster.md, "Secrets").
SECRETS = "~/.nre_ray/secrets"
TOKEN_PATH = "$HOME/.nre_ray/secrets/ray_auth_token"


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
    """The known-good set the default install pins: constraints.txt's ``==`` versions with pyproject.toml's extras
    (pyproject.toml's dependencies are the tested ranges; :func:`test_the_pins_are_inside_the_tested_ranges`)."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    ranges = {canonicalize_name(r.name): r for r in map(Requirement, dependencies)}
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pin = Requirement(line)
            name = canonicalize_name(pin.name)
            extras = f"[{','.join(sorted(ranges[name].extras))}]" if name in ranges and ranges[name].extras else ""
            pins[name] = Requirement(f"{pin.name}{extras}{pin.specifier}")
    return pins


def pin_mismatches(raw: dict) -> list[str]:
    """Differences between setup_commands and the known-good set (constraints.txt, pyproject.toml's extras) for the
    PINNED packages (version and extras)."""
    cluster, project = setup_command_pins(raw), pyproject_pins()
    problems = []
    for name in PINNED:
        if name not in project:
            problems.append(f"{name}: no '==' pin in constraints.txt")
        elif name not in cluster:
            problems.append(f"{name}: not installed with '==' by setup_commands (pyproject has {project[name]})")
        elif (cluster[name].specifier, cluster[name].extras) != (project[name].specifier, project[name].extras):
            problems.append(f"{name}: cluster.yaml installs {cluster[name]}, constraints.txt pins {project[name]}")
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


def shell_words(command: str) -> list[str]:
    """The words of a shell command, those of a `bash -c '...'` script among them."""
    words = shlex.split(command)
    return [w for word in words for w in (shlex.split(word) if " " in word else [word])]


def ray_starts(raw: dict) -> list[str]:
    """Every command of the file that runs `ray start`."""
    commands = [*raw["head_start_ray_commands"], *raw["worker_start_ray_commands"]]
    return [c for c in commands if re.search(r"\bray start\b", c)]


def start_environment(command: str) -> dict[str, str]:
    """The variables a `... VAR=value ray start ...` command sets for `ray start` (as the shell sees them)."""
    before = re.split(r"\bray start\b", command.rpartition(";")[2])[0]
    return dict(word.split("=", 1) for word in shlex.split(before) if "=" in word)


def mlflow_server_args(raw: dict) -> dict[str, str]:
    """Options of the `mlflow server` command started by head_start_ray_commands."""
    for command in raw.get("head_start_ray_commands", []):
        tokens = shell_words(command)
        if "mlflow" in [Path(t).name for t in tokens] and "server" in tokens:
            options = tokens[tokens.index("server") + 1 :]
            return dict(zip(options[::2], options[1::2], strict=True))
    return {}


def worker_instance_profiles(raw: dict) -> dict[str, str]:
    """Instance profile name of each worker node type (None when it has none), from its IamInstanceProfile."""
    profiles = {}
    for name, node_type in raw["available_node_types"].items():
        if name == raw["head_node_type"]:
            continue
        profile = node_type["node_config"].get("IamInstanceProfile") or {}
        arn = profile.get("Arn", "")
        profiles[name] = arn.rpartition(":instance-profile/")[2] if ":instance-profile/" in arn else profile.get("Name")
    return profiles


def iam_block(doc: str) -> str:
    """The bash block that follows the doc's "S3 access for the GPU workers" paragraph."""
    start = doc.index("```bash\n", doc.index("**S3 access for the GPU workers.**")) + len("```bash\n")
    return doc[start : doc.index("```\n", start)]


def heredoc_documents(block: str) -> dict[str, str]:
    """`cat > "$DIR/name.json" <<EOF ... EOF` bodies of the block, by file name, before variable expansion."""
    pattern = re.compile(r'^cat > "[^"\n]*/([\w.-]+)" <<(\w+)\n(.*?)^\2$', re.MULTILINE | re.DOTALL)
    return {match.group(1): match.group(3) for match in pattern.finditer(block)}


def expand(text: str, variables: dict[str, str]) -> str:
    """What bash makes of $VAR and ${VAR} in an unquoted heredoc, for the given variables."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables[m.group(1) or m.group(2)], text)


def iam_commands(block: str) -> list[list[str]]:
    """The `aws iam ...` commands of the block as argument lists (heredoc bodies, comments and line breaks removed)."""
    for body in heredoc_documents(block).values():
        block = block.replace(body, "")
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        tokens = shlex.split(line, comments=True)
        if tokens[:2] == ["aws", "iam"]:
            commands.append(tokens[2:])
    return commands


def command_options(commands: list[list[str]], subcommand: str) -> list[dict[str, str]]:
    """`--option value` pairs of every command with that subcommand (e.g. "put-role-policy")."""
    return [dict(zip(c[1::2], c[2::2], strict=True)) for c in commands if c[0] == subcommand]


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def worker_policy_problems(policy: dict, bucket: str) -> list[str]:
    """What the workers' policy allows beyond S3 objects under PROJECT_PREFIX of `bucket` (and listing the bucket)."""
    objects, bucket_arn = f"arn:aws:s3:::{bucket}/{PROJECT_PREFIX}*", f"arn:aws:s3:::{bucket}"
    problems = []
    for number, statement in enumerate(policy["Statement"]):
        where = f"statement {statement.get('Sid', number)}"
        if statement.get("Effect") != "Allow":
            continue  # a Deny only narrows
        if {"NotAction", "NotResource"} & set(statement):
            problems.append(f"{where}: NotAction/NotResource allow everything not listed")
            continue
        actions, resources = as_list(statement.get("Action", [])), as_list(statement.get("Resource", []))
        problems += [f"{where}: {a} is not an S3 action" for a in actions if not a.startswith("s3:")]
        problems += [f"{where}: wildcard action {a}" for a in actions if "*" in a]
        s3_actions = [a for a in actions if a.startswith("s3:") and "*" not in a]
        for action in s3_actions:
            allowed = bucket_arn if action in S3_BUCKET_ACTIONS else objects
            problems += [f"{where}: {action} on {r} (only {allowed})" for r in resources if r != allowed]
    return problems


def pass_role_problems(policy: dict, worker_role_arn: str) -> list[str]:
    """What the head's policy allows beyond iam:PassRole on the workers' role."""
    problems = []
    for number, statement in enumerate(policy["Statement"]):
        where = f"statement {statement.get('Sid', number)}"
        if statement.get("Effect") != "Allow":
            continue
        if {"NotAction", "NotResource"} & set(statement):
            problems.append(f"{where}: NotAction/NotResource allow everything not listed")
            continue
        actions, resources = as_list(statement.get("Action", [])), as_list(statement.get("Resource", []))
        problems += [f"{where}: {a} (only iam:PassRole)" for a in actions if a != "iam:PassRole"]
        problems += [f"{where}: passes {r} (only {worker_role_arn})" for r in resources if r != worker_role_arn]
    return problems


def doc_policies(doc: str) -> dict[tuple[str, str], dict]:
    """The IAM commands' policy documents, by the role and kind they are given to: ("nre-ray-worker", "trust"),
    (role, policy name) for put-role-policy. Variables expanded to the cluster.yaml placeholders."""
    block = iam_block(doc)
    documents = {name: json.loads(expand(body, DOC_VARIABLES)) for name, body in heredoc_documents(block).items()}

    def document(option: str) -> dict:
        assert option.startswith("file://"), f"policy documents are files written by the block: {option}"
        return documents[Path(option.removeprefix("file://")).name]

    commands = iam_commands(block)
    policies = {
        (o["--role-name"], "trust"): document(o["--assume-role-policy-document"])
        for o in command_options(commands, "create-role")
    }
    policies.update(
        {
            (o["--role-name"], o["--policy-name"]): document(o["--policy-document"])
            for o in command_options(commands, "put-role-policy")
        }
    )
    return policies


def role_policies(policies: dict[tuple[str, str], dict], role: str) -> list[dict]:
    return [policy for (name, kind), policy in policies.items() if name == role and kind != "trust"]


def markdown_section(text: str, heading: str) -> str:
    """From the `## heading` line up to the next `## ` heading (or the end)."""
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end == -1 else text[start : end + 1]


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


def test_the_pins_are_inside_the_tested_ranges():
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    ranges = {canonicalize_name(r.name): r for r in map(Requirement, dependencies)}
    for name, pin in pyproject_pins().items():
        (version,) = [s.version for s in pin.specifier if s.operator == "=="]
        assert ranges[name].specifier.contains(version), f"{pin} is outside pyproject.toml's {ranges[name]}"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"torch==2.13.0"', '"torch==2.12.0"'),
        ('"mlflow==3.17.2"', '"mlflow==3.18.0"'),
        ("ray[train,data,default,serve]==", "ray[train,data,serve]=="),  # `default` matters (notes/stack.md)
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


def test_every_ray_start_runs_with_token_authentication_and_the_mounted_token(raw):
    starts = ray_starts(raw)
    assert len(starts) == 2, starts  # the head's and the workers'
    for command in starts:
        variables = start_environment(command)
        assert variables.get("RAY_AUTH_MODE") == "token", command  # never left to Ray's guess
        assert variables.get("RAY_AUTH_TOKEN_PATH") == TOKEN_PATH, command
        assert variables.get("MLFLOW_TRACKING_USERNAME") == "admin", command  # the workers log to MLflow
        assert variables.get("MLFLOW_TRACKING_PASSWORD") == "$(cat $HOME/.nre_ray/secrets/mlflow_password)", command
    # A start without the mode would be found
    broken = [c.replace("RAY_AUTH_MODE=token ", "") for c in starts]
    assert [start_environment(c).get("RAY_AUTH_MODE") for c in broken] == [None, None]


def test_the_secrets_reach_every_node_through_file_mounts_and_are_checked(raw):
    # file_mounts go to the head and, from it, to every worker the autoscaler adds
    assert raw["file_mounts"].get(SECRETS) == SECRETS
    assert any(f"test -s {SECRETS}/ray_auth_token" in c and f"chmod 600 {SECRETS}/*" in c
               for c in raw["setup_commands"])  # on every node, before Ray starts


def test_a_secret_value_would_be_found():
    token = "0123456789abcdef" * 4
    for line in (f"RAY_AUTH_TOKEN={token}", "MLFLOW_TRACKING_PASSWORD=hunter2hunter2", f"# {token}",
                 "admin_password = hunter2hunter2", "MLFLOW_AUTH_ADMIN_PASSWORD='s3cret-s3cret'"):
        assert find_secrets(CLUSTER_YAML.read_text() + f"\n{line}\n"), line


def test_mlflow_server_on_the_head(raw):
    args = mlflow_server_args(raw)
    assert args.get("--app-name") == "basic-auth", "every request to MLflow needs a user and password"
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


# ---------------------------------------------------------------------------------------------------------------
# Least privilege for the GPU workers (docs/cluster.md, "S3 access for the GPU workers")
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def policies() -> dict[tuple[str, str], dict]:
    return doc_policies(CLUSTER_DOC.read_text())


def test_worker_node_types_do_not_get_the_autoscalers_instance_profile(raw):
    profiles = worker_instance_profiles(raw)
    assert profiles, "there must be a worker node type"
    # Ray gives ray-autoscaler-v1 (EC2 + S3 full access) to the head only; a worker needs a profile of its own.
    assert AUTOSCALER_PROFILE not in profiles.values()
    assert profiles == dict.fromkeys(profiles, WORKER_ROLE), "the profile docs/cluster.md creates"
    raw["available_node_types"]["nre.worker.gpu"]["node_config"]["IamInstanceProfile"] = {
        "Arn": f"arn:aws:iam::YOUR-ACCOUNT-ID:instance-profile/{AUTOSCALER_PROFILE}"
    }
    assert worker_instance_profiles(raw)["nre.worker.gpu"] == AUTOSCALER_PROFILE


def test_the_iam_commands_are_valid_bash():
    block = iam_block(CLUSTER_DOC.read_text())
    subprocess.run(["bash", "-n"], input=block, text=True, check=True)
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run(["bash", "-n"], input=block.replace("<<EOF", "<<(EOF", 1), text=True, check=True)


def test_the_doc_creates_the_profile_cluster_yaml_names_and_puts_the_worker_role_in_it(raw):
    commands = iam_commands(iam_block(CLUSTER_DOC.read_text()))
    (profile,) = set(worker_instance_profiles(raw).values())
    assert command_options(commands, "create-instance-profile") == [{"--instance-profile-name": profile}]
    assert command_options(commands, "add-role-to-instance-profile") == [
        {"--instance-profile-name": profile, "--role-name": WORKER_ROLE}
    ]
    assert [o["--role-name"] for o in command_options(commands, "create-role")] == [WORKER_ROLE]


def test_only_ec2_may_assume_the_worker_role(policies):
    (statement,) = policies[(WORKER_ROLE, "trust")]["Statement"]
    assert statement == {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}


def test_the_worker_policy_allows_s3_objects_under_the_project_prefix_only(policies):
    (policy,) = role_policies(policies, WORKER_ROLE)
    assert worker_policy_problems(policy, "YOUR-BUCKET") == []
    allowed = {(a, r) for s in policy["Statement"] for a in as_list(s["Action"]) for r in as_list(s["Resource"])}
    # Ray Train's checkpoints through pyarrow: read, write (multipart included), delete, abort a failed upload, and
    # list; pyarrow's create_dir also sends HEAD bucket, which S3 authorizes as s3:ListBucket without a prefix.
    objects = "arn:aws:s3:::YOUR-BUCKET/nre_ray/*"
    assert allowed == {
        ("s3:GetObject", objects),
        ("s3:PutObject", objects),
        ("s3:DeleteObject", objects),
        ("s3:AbortMultipartUpload", objects),
        ("s3:ListBucket", "arn:aws:s3:::YOUR-BUCKET"),
    }


@pytest.mark.parametrize(
    "statement",
    [
        {"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::YOUR-BUCKET/nre_ray/*"},
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::YOUR-BUCKET/*"},
        {"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::OTHER-BUCKET"},
        {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"},
    ],
    ids=["ec2", "s3-wildcard", "whole-bucket-objects", "any-resource", "other-bucket", "not-action"],
)
def test_a_broader_worker_policy_would_be_reported(policies, statement):
    (policy,) = role_policies(policies, WORKER_ROLE)
    policy["Statement"].append(statement)
    assert len(worker_policy_problems(policy, "YOUR-BUCKET")) == 1


def test_the_head_may_pass_the_worker_role_and_no_other(policies):
    worker_role_arn = f"arn:aws:iam::YOUR-ACCOUNT-ID:role/{WORKER_ROLE}"
    (policy,) = role_policies(policies, AUTOSCALER_PROFILE)  # ray up names the head's role like its profile
    assert pass_role_problems(policy, worker_role_arn) == []
    assert {r for s in policy["Statement"] for r in as_list(s["Resource"])} == {worker_role_arn}
    policy["Statement"][0]["Resource"] = [worker_role_arn, f"arn:aws:iam::YOUR-ACCOUNT-ID:role/{AUTOSCALER_PROFILE}"]
    assert len(pass_role_problems(policy, worker_role_arn)) == 1


def test_every_iam_policy_document_is_given_to_a_role(policies):
    # No heredoc is written and then left unused (or used by a command the parsing above misses).
    block = iam_block(CLUSTER_DOC.read_text())
    assert len(policies) == len(heredoc_documents(block)) == 3


def test_readme_points_to_docs_cluster_md_instead_of_repeating_it():
    # Each detail lives in one place: the README's section is a short summary and a link.
    section = markdown_section(README.read_text(), CLUSTER_SECTION)
    assert "(docs/cluster.md)" in section
    assert "aws iam" not in section  # no copy of the IAM commands
    assert len(section.splitlines()) < 25


# ---------------------------------------------------------------------------------------------------------------
# Spot GPU workers and the spot watcher (docs/cluster.md, "Spot GPUs")
# ---------------------------------------------------------------------------------------------------------------

ON_DEMAND, SPOT = "nre.worker.gpu", "nre.worker.gpu.spot"


def test_the_spot_worker_type_is_the_gpu_worker_at_the_spot_price(raw, offline):
    types = validate_offline(raw)["available_node_types"]
    spot = dict(types[SPOT]["node_config"])
    assert spot.pop("InstanceMarketOptions") == {"MarketType": "spot"}
    assert spot == types[ON_DEMAND]["node_config"], "the same instance, image, disk and instance profile"
    assert "InstanceMarketOptions" not in types[ON_DEMAND]["node_config"]
    assert types[SPOT]["min_workers"] == types[ON_DEMAND]["min_workers"] == 0, "no GPU bill while idle"


def _gpu_nodes_for(types: dict, gpus: int) -> dict[str, int]:
    """The worker nodes Ray's autoscaler (v1) would add for ``gpus`` one-GPU bundles, on g5.xlarge nodes."""
    types = {name: {**t, "resources": {"CPU": 4, "GPU": 1} if name != "nre.head.cpu" else {"CPU": 8}}
             for name, t in types.items()}
    scorer = functools.partial(_default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({}))
    added, _ = get_nodes_for(types, {}, "nre.head.cpu", 4, [{"GPU": 1}] * gpus, scorer)
    return dict(added)


def test_a_gpu_request_gets_spot_nodes_unless_spot_is_turned_off(raw):
    # As docs/cluster.md and cluster.yaml say: both types fit, the autoscaler takes the one whose name sorts last.
    assert _gpu_nodes_for(raw["available_node_types"], 2) == {SPOT: 2}
    raw["available_node_types"][SPOT]["max_workers"] = 0
    assert _gpu_nodes_for(raw["available_node_types"], 2) == {ON_DEMAND: 2}


def _watcher_command(raw: dict) -> tuple[int, list[str]]:
    """The index of the worker start command that runs the spot watcher, and the watcher's own arguments."""
    module = "nre_ray.cluster.spot_watch"
    for index, command in enumerate(raw["worker_start_ray_commands"]):
        words = shlex.split(command)
        if f"-m {module}" in " ".join(words):
            assert words[words.index("-m") - 1].endswith("/nre-venv/bin/python"), "the venv of setup_commands"
            return index, words[words.index("-m") + 2:]
    raise AssertionError(f"no worker start command runs python -m {module}")


def test_every_worker_starts_the_spot_watcher_after_ray(raw):
    index, args = _watcher_command(raw)
    ray_start = next(i for i, c in enumerate(raw["worker_start_ray_commands"]) if "ray start" in c)
    assert index > ray_start
    parsed = spot_watch.build_parser().parse_args(args)
    assert parsed.address == "$RAY_HEAD_IP:6379", "the head's GCS, as `ray start --address` joins it"
    assert parsed.endpoint == spot_watch.METADATA == "http://169.254.169.254", "the real instance metadata"
    assert "systemd-run --unit=nre-spot-watch" in raw["worker_start_ray_commands"][index]
    assert any("systemctl stop nre-spot-watch" in c for c in raw["worker_start_ray_commands"][ray_start:index]), \
        "a watcher of a previous start is stopped first"


def test_a_watcher_started_with_an_unknown_option_would_be_found(raw):
    index, _ = _watcher_command(raw)
    raw["worker_start_ray_commands"][index] += " --gcs-address x"
    with pytest.raises(SystemExit):
        spot_watch.build_parser().parse_args(_watcher_command(raw)[1])
