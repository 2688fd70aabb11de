"""docker-compose.yml, read as data: no Docker engine is needed to check what it promises."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from api.serving.stopping import GRACEFUL_SHUTDOWN
from api.settings import ApiSettings
from carmy_worker.__main__ import load_tools
from carmy_worker.settings import WorkerSettings
from tests.support import ROOT

Compose = dict[str, Any]

_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> Compose:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}`` and ``${VAR:-default}``; an unset variable without a default fails."""

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if env.get(name):
            return env[name]
        if default is None:
            raise KeyError(f"${{{name}}} has no default: `docker compose up` needs it set")
        return default

    return _VARIABLE.sub(replace, value)


def options(command: list[str]) -> dict[str, str]:
    """``["redis-server", "--a", "1", "--b", "2"]`` -> ``{"--a": "1", "--b": "2"}``."""
    return dict(zip(command[1::2], command[2::2], strict=True))


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, f"cannot read duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


def redis_password(compose: Compose, env: dict[str, str]) -> str:
    return interpolate(options(compose["services"]["redis"]["command"])["--requirepass"], env)


# -- redis -----------------------------------------------------------------------------------

def test_redis_is_not_published(compose: Compose) -> None:
    redis = compose["services"]["redis"]
    assert "ports" not in redis
    assert redis.get("network_mode") != "host"


def test_redis_keeps_data_with_aof_every_second_and_never_evicts(compose: Compose) -> None:
    redis = compose["services"]["redis"]
    assert redis["image"] == "redis:7"
    opts = options(redis["command"])
    assert opts["--appendonly"] == "yes"
    assert opts["--appendfsync"] == "everysec"
    assert opts["--maxmemory-policy"] == "noeviction"
    assert opts["--hash-max-listpack-value"] == "256"  # a queued job's hash stays compact
    # A limit, so that a full Redis refuses new calls rather than the host killing it.
    assert interpolate(opts["--maxmemory"], {}) == "1gb"


def test_redis_data_lives_in_a_named_volume(compose: Compose) -> None:
    mounts = compose["services"]["redis"]["volumes"]
    named = [m.split(":")[0] for m in mounts if m.split(":")[1] == "/data"]
    assert named and named[0] in compose["volumes"]


def test_redis_requires_a_password_and_its_health_check_uses_it(compose: Compose) -> None:
    redis = compose["services"]["redis"]
    assert redis_password(compose, {})  # a default, so `docker compose up` works as is
    assert redis_password(compose, {"REDIS_PASSWORD": "from-the-env-file"}) == "from-the-env-file"
    for env in ({}, {"REDIS_PASSWORD": "from-the-env-file"}):
        assert interpolate(redis["environment"]["REDISCLI_AUTH"], env) == redis_password(compose, env)
    check = healthcheck_text(redis)
    assert "redis-cli" in check and "ping" in check
    # redis-cli exits 0 even on NOAUTH, so the check must look at the reply.
    assert "PONG" in check


def test_the_default_password_is_the_one_env_example_documents(compose: Compose) -> None:
    lines = (ROOT / ".env.example").read_text().splitlines()
    documented = next(line.split("=", 1)[1] for line in lines if line.startswith("REDIS_PASSWORD="))
    assert redis_password(compose, {}) == documented


# -- api and worker ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["api", "worker"])
def test_processes_reach_redis_by_service_name_with_its_password(compose: Compose, name: str) -> None:
    raw = compose["services"][name]["environment"]["CARMY_REDIS_URL"]
    assert "${REDIS_PASSWORD" in raw
    for env in ({}, {"REDIS_PASSWORD": "from-the-env-file"}):
        url = urlsplit(interpolate(raw, env))
        assert url.scheme == "redis"
        assert url.hostname == "redis"
        assert url.password == redis_password(compose, env)


@pytest.mark.parametrize("name", ["api", "worker"])
def test_processes_wait_for_a_healthy_redis(compose: Compose, name: str) -> None:
    assert compose["services"][name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_api_and_worker_run_the_same_image(compose: Compose) -> None:
    api, worker = compose["services"]["api"], compose["services"]["worker"]
    assert api["build"] == worker["build"]
    assert api["image"] == worker["image"]
    assert (ROOT / api["build"]["context"] / api["build"]["dockerfile"]).is_file()


def test_api_listens_on_all_interfaces_and_publishes_its_port(compose: Compose) -> None:
    api = compose["services"]["api"]
    assert api["command"] == ["python", "-m", "api"]
    env = api["environment"]
    assert env["CARMY_HOST"] == "0.0.0.0"
    container_ports = [str(p).rsplit(":", 1)[-1] for p in api["ports"]]
    assert env["CARMY_PORT"] in container_ports
    check = healthcheck_text(api)
    assert f"127.0.0.1:{env['CARMY_PORT']}/health" in check


def documented_settings() -> set[str]:
    """Every CARMY_ setting .env.example names (set or commented out)."""
    text = (ROOT / ".env.example").read_text()
    return set(re.findall(r"^#? ?(CARMY_[A-Z_]+)=", text, flags=re.M))


def test_every_setting_env_example_documents_reaches_a_service(compose: Compose) -> None:
    services = compose["services"]
    passed = {name for service in ("api", "worker") for name, value in services[service]["environment"].items()
              if f"${{{name}" in str(value)}
    assert documented_settings() == passed


def test_every_setting_the_readme_lists_is_documented_for_compose() -> None:
    """The README's Settings table is what a user reads; .env.example (and so compose, above)
    must carry each of them, but for those compose sets itself."""
    table = set(re.findall(r"^\| `(CARMY_[A-Z_]+)` \|", (ROOT / "README.md").read_text(), flags=re.M))
    assert table - {"CARMY_HOST", "CARMY_PORT", "CARMY_REDIS_URL"} <= documented_settings()


def test_each_setting_reaches_every_service_the_readme_says_uses_it(compose: Compose) -> None:
    """A setting the README's table says is used by ``both`` (the audit trail's bounds, which
    every janitor keeps) must reach the worker as well as the API: set on one only, the two
    would trim to different bounds."""
    rows = re.findall(r"^\| `(CARMY_[A-Z_]+)` \| (API|worker|both) \|", (ROOT / "README.md").read_text(), flags=re.M)
    assert ("CARMY_AUDIT_RETENTION", "both") in rows
    services = {"API": {"api"}, "worker": {"worker"}, "both": {"api", "worker"}}
    missing = [(name, service) for name, used_by in rows for service in services[used_by]
               if name not in compose["services"][service]["environment"]]
    assert missing == []


def test_api_settings_pass_through_and_default_when_unset(compose: Compose) -> None:
    env = compose["services"]["api"]["environment"]
    for name in ("CARMY_SERVER_NAME", "CARMY_MAX_PENDING", "CARMY_API_KEYS", "CARMY_REDIS_WAIT_REPLICAS",
                 "CARMY_BODY_TIMEOUT"):
        assert f"${{{name}" in env[name]
        assert interpolate(env[name], {name: "set"}) == "set"
        interpolate(env[name], {})  # has a default: works without a .env
    settings = ApiSettings.from_env({name: interpolate(str(value), {}) for name, value in env.items()})
    assert (settings.redis_connections, settings.wait_replicas, settings.body_timeout) == (16, 0, 30.0)


def test_api_answers_only_to_the_names_it_is_reached_by(compose: Compose) -> None:
    env = compose["services"]["api"]["environment"]
    settings = ApiSettings.from_env({name: interpolate(str(value), {}) for name, value in env.items()})
    hosts = settings.hosts_allowed()
    # Bound to 0.0.0.0, the API would answer any Host: a web page could reach it by DNS rebinding.
    assert "*" not in hosts
    assert {"localhost", "127.0.0.1", "api"} <= set(hosts)  # the published port, and other containers
    assert interpolate(env["CARMY_ALLOWED_HOSTS"], {"CARMY_ALLOWED_HOSTS": "x.example"}) == "x.example"


def test_workers_scale_with_compose(compose: Compose) -> None:
    worker = compose["services"]["worker"]
    assert worker["deploy"]["replicas"] == 2
    # Either would make a second replica collide with the first.
    assert "container_name" not in worker
    assert "ports" not in worker


def test_worker_serves_the_example_shop_and_is_checked_by_its_heartbeat(compose: Compose) -> None:
    worker = compose["services"]["worker"]
    assert worker["command"] == ["python", "-m", "carmy_worker", "examples.shop"]
    assert worker["healthcheck"]["test"] == ["CMD", "python", "-m", "carmy_worker.health"]


def test_worker_gets_time_to_drain_its_longest_tool(compose: Compose) -> None:
    worker = compose["services"]["worker"]
    default = WorkerSettings().default_timeout
    longest = max(t.timeout or default for t in load_tools(worker["command"][-1]))
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"
    # A margin for the worker to record results and deregister after the last tool ends.
    assert seconds(worker["stop_grace_period"]) >= longest + 5


def test_api_gets_its_grace_and_the_time_to_answer_what_still_waits(compose: Compose) -> None:
    """uvicorn's grace on SIGTERM, at whose end the calls still waiting answer SERVER_STOPPING:
    a shorter stop_grace_period would kill the API first (Docker's default is 10 s)."""
    api = compose["services"]["api"]
    assert api.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert seconds(api["stop_grace_period"]) > GRACEFUL_SHUTDOWN


def test_every_variable_has_a_default() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert _VARIABLE.search(text)
    interpolate(text, {})  # raises on a variable `docker compose up` would leave empty
