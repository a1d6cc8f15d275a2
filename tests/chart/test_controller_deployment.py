"""The controller Deployment: flags the real controller accepts, non-root, one replica."""

from gpushare.cluster.settings import parse_args, parse_service
from gpushare.packing.interference import MODEL_ENV
from gpushare.packing.policy import DEFAULT_POLICY, Policy
from tests.chart.controller_flags import parseable
from tests.fixtures.helm_chart import Chart, container


def _controller(chart: Chart, values: dict | None = None) -> dict:  # type: ignore[type-arg]
    return chart.render(values).get("Deployment", "gpushare-controller")


def test_flags_parse_with_the_controllers_own_parser(chart: Chart) -> None:
    deploy = _controller(chart)
    c = container(deploy, "controller")
    assert c["command"] == ["gpushare-controller"]
    settings = parse_args(parseable(c["args"]))
    assert settings.extender_host == "0.0.0.0"
    assert settings.register_webhooks
    # The chart installs the policy the code defaults to (the one the benchmarks justify).
    assert settings.policy is DEFAULT_POLICY is Policy.GPUSHARE
    assert settings.interference_admission  # as the GPU benchmark decides
    namespace, name, port = parse_service(settings.webhook_service or "")
    assert (namespace, name, port) == ("gpushare-system", "gpushare-controller", 443)
    assert settings.webhook_exclude_namespaces == ("kube-system",)
    assert settings.operator_enabled


def test_values_reach_the_controller(chart: Chart) -> None:
    deploy = _controller(
        chart,
        {
            "controller": {
                "policy": "spread",
                "interferenceAdmission": False,
                "opportunistic": {"enabled": True, "default": True, "governorPeriodSeconds": 15},
                "logLevel": "DEBUG",
                "operator": False,
                "extender": {"port": 18888},
                "extraArgs": ["--resync-seconds=60"],
            },
            "webhook": {"port": 19443, "timeoutSeconds": 9, "excludeNamespaces": ["a", "b"]},
        },
    )
    c = container(deploy, "controller")
    settings = parse_args(parseable(c["args"]))
    assert str(settings.policy) == "spread"
    assert not settings.interference_admission
    assert settings.opportunistic_placement and settings.opportunistic_default
    assert settings.governor_period_seconds == 15
    assert settings.governor_settle_seconds == 60
    assert settings.log_level == "DEBUG"
    assert not settings.operator_enabled
    assert settings.extender_port == 18888
    assert settings.webhook_port == 19443
    assert settings.webhook_timeout_seconds == 9
    assert settings.webhook_exclude_namespaces == ("a", "b")
    assert settings.resync_seconds == 60
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"extender": 18888, "webhook": 19443}
    # Every replica serves the webhook port; only the leader serves the extender.
    assert c["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "webhook",
        "scheme": "HTTPS",
    }


def test_replicas_elect_a_leader_and_spread_over_nodes(chart: Chart) -> None:
    """Two replicas by default; a Lease keeps two from ever binding at once, so they may
    roll (docs/security.md)."""
    deploy = _controller(chart)
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    c = container(deploy, "controller")
    settings = parse_args(parseable(c["args"]))
    assert settings.leader_elect
    assert settings.leader_elect_namespace == "gpushare-system"
    assert settings.leader_elect_name == "gpushare-controller"
    assert settings.leader_elect_lease_seconds <= 15
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_tenancy_values_reach_the_controller(chart: Chart) -> None:
    default = parse_args(parseable(container(_controller(chart), "controller")["args"]))
    assert (default.tenancy, default.neighbour_rules) == ("namespace", "granted-namespaces")
    opened = _controller(
        chart, {"tenancy": {"crossNamespaceSharing": True, "neighbourRules": "everyone"}}
    )
    settings = parse_args(parseable(container(opened, "controller")["args"]))
    assert (settings.tenancy, settings.neighbour_rules) == ("cluster", "everyone")


def test_runs_as_non_root_without_capabilities(chart: Chart) -> None:
    deploy = _controller(chart)
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = container(deploy, "controller")["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["serviceAccountName"] == "gpushare-controller"


def test_webhook_certificate_comes_from_the_controller_or_cert_manager(chart: Chart) -> None:
    # One certificate for every replica: a Secret either way (the controller's own, copied
    # into a directory of its pod, or cert-manager's, mounted).
    own = _controller(chart)
    volumes = {v["name"]: v for v in own["spec"]["template"]["spec"]["volumes"]}
    assert "secret" not in volumes["webhook-certs"]
    settings = parse_args(parseable(container(own, "controller")["args"]))
    assert settings.certificates.secrets == "gpushare-system/gpushare-controller"
    assert settings.certificates.issue
    managed = _controller(chart, {"webhook": {"certManager": {"enabled": True}}})
    volumes = {v["name"]: v for v in managed["spec"]["template"]["spec"]["volumes"]}
    assert volumes["webhook-certs"]["secret"]["secretName"] == "gpushare-controller-webhook-tls"
    args = container(managed, "controller")["args"]
    assert parse_args(parseable(args)).webhook_cert_dir is not None
    assert not parse_args(parseable(args)).certificates.issue


def test_image_follows_values(chart: Chart) -> None:
    c = container(_controller(chart), "controller")
    assert c["image"] == "gpushare/gpushare:0.1.0"
    assert c["imagePullPolicy"] == "IfNotPresent"
    custom = _controller(chart, {"image": {"repository": "r.example/gs", "tag": "dev"}})
    assert container(custom, "controller")["image"] == "r.example/gs:dev"


def test_operator_follows_the_agent_port_and_the_release_name(chart: Chart) -> None:
    """The operator reads /profile where the agents publish it and keeps its profile cache in
    the ConfigMap the controller's RBAC grants, under any release name and agent port."""
    rendered = chart.render({"node": {"metrics": {"port": 19445}}}, release="team-a")
    deploy = rendered.get("Deployment", "team-a-gpushare-controller")
    settings = parse_args(parseable(container(deploy, "controller")["args"]))
    assert settings.agent_url == "http://{node_ip}:19445"
    assert settings.profile_cache_name == "team-a-gpushare-profile-cache"
    role = rendered.get("Role", "team-a-gpushare-controller")
    granted = {
        name
        for rule in role["rules"]
        if "configmaps" in rule["resources"]
        for name in rule.get("resourceNames", [])
    }
    assert settings.profile_cache_name in granted
    proxied = _controller(chart, {"controller": {"agentURL": "https://{node}.agents.example:8443"}})
    settings = parse_args(parseable(container(proxied, "controller")["args"]))
    assert settings.agent_url == "https://{node}.agents.example:8443"


def test_an_agent_url_with_a_path_is_refused_by_the_schema(chart: Chart) -> None:
    err = chart.fails({"controller": {"agentURL": "http://{node_ip}:9445/profile"}})
    assert "agentURL" in err


def test_in_dra_mode_the_controller_places_claims_unless_told_not_to(chart: Chart) -> None:
    placed = parse_args(
        parseable(container(_controller(chart, {"mode": "dra"}), "controller")["args"])
    )
    assert placed.annotation_mode == "dra" and placed.places_claims
    mixed = {"node": {"extraPools": [{"name": "dra", "mode": "dra", "nodeSelector": {"p": "d"}}]}}
    beside = parse_args(parseable(container(_controller(chart, mixed), "controller")["args"]))
    assert beside.annotation_mode == "deviceplugin" and beside.places_claims
    plain = parse_args(parseable(container(_controller(chart), "controller")["args"]))
    assert not plain.places_claims
    values = {"mode": "dra", "dra": {"placement": "kube-scheduler"}}
    left = parse_args(parseable(container(_controller(chart, values), "controller")["args"]))
    assert not left.places_claims


def test_a_calibrated_interference_model_reaches_the_controller(chart: Chart) -> None:
    # Unset: no variable, the shipped model.
    c = container(_controller(chart), "controller")
    assert MODEL_ENV not in {e["name"] for e in c["env"]}
    deploy = _controller(chart, {"controller": {"interferenceModelConfigMap": "gpu-model"}})
    c = container(deploy, "controller")
    env = {e["name"]: e.get("value") for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "interference-model")
    volume = next(
        v
        for v in deploy["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "interference-model"
    )
    assert volume["configMap"]["name"] == "gpu-model"
    (item,) = volume["configMap"]["items"]
    # The variable names the file the ConfigMap's key is mounted as, read-only.
    assert env[MODEL_ENV] == f"{mount['mountPath']}/{item['path']}"
    assert item["key"] == "interference.json" and mount["readOnly"] is True
    refused = chart.fails({"controller": {"interferenceModelConfigMap": "Bad Name"}})
    assert "interferenceModelConfigMap" in refused


def test_pod_tolerations_and_runtime_class_reach_the_webhook(chart: Chart) -> None:
    """The default tolerates GKE's nvidia.com/gpu taint; an empty list turns it off (the
    controller's own default would otherwise apply)."""
    settings = parse_args(parseable(container(_controller(chart), "controller")["args"]))
    assert settings.pod_tolerations == ("nvidia.com/gpu:NoSchedule",)
    assert settings.pod_runtime_class == ""
    values = {"webhook": {"podTolerations": [], "podRuntimeClassName": "nvidia"}}
    args = container(_controller(chart, values), "controller")["args"]
    settings = parse_args(parseable(args))
    assert settings.pod_tolerations == ()
    assert settings.pod_runtime_class == "nvidia"


def test_the_webhook_answers_only_the_api_servers_certificate_when_given_its_ca(
    chart: Chart,
) -> None:
    """Forged reviews (issue 67): with webhook.clientCA.configMap the controller gets
    --webhook-client-ca naming the ConfigMap's key, mounted read-only; unset, no flag (any
    caller is answered, as before) and no volume."""
    plain = container(_controller(chart), "controller")
    assert parse_args(parseable(plain["args"])).webhook.client_ca is None
    assert "webhook-client-ca" not in {m["name"] for m in plain["volumeMounts"]}
    values = {"webhook": {"clientCA": {"configMap": "apiserver-webhook-client", "key": "ca.pem"}}}
    deploy = _controller(chart, values)
    c = container(deploy, "controller")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "webhook-client-ca")
    volume = next(
        v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-client-ca"
    )
    assert volume["configMap"] == {
        "name": "apiserver-webhook-client",
        "items": [{"key": "ca.pem", "path": "ca.pem"}],
    }
    assert mount["readOnly"] is True
    # (parse_args would refuse the path here: the file exists only in the pod.)
    assert f"--webhook-client-ca={mount['mountPath']}/ca.pem" in c["args"]
    refused = chart.fails({"webhook": {"clientCA": {"configMap": "Bad Name"}}})
    assert "configMap" in refused
