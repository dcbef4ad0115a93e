"""The serving config: TOML and YAML read alike, and every mistake names its key."""
from __future__ import annotations

import pytest

from router.config import ConfigError, PoolConfig, ServeConfig, config_keys, load_config, parse_config

TOML = """
[router]
port = 50123
max_queue = 3

[[pools]]
name = "a-bf16"
kv_format = "bf16"

[[pools]]
name = "a-nvfp4"
kv_format = "nvfp4"
decode_workers = 2
gpus_per_worker = 0.5
"""

YAML = """
router:
  port: 50123
  max_queue: 3
pools:
  - name: a-bf16
    kv_format: bf16
  - name: a-nvfp4
    kv_format: nvfp4
    decode_workers: 2
    gpus_per_worker: 0.5
"""


def test_toml_and_yaml_give_the_same_config(tmp_path):
    (tmp_path / "c.toml").write_text(TOML)
    (tmp_path / "c.yaml").write_text(YAML)
    a, b = load_config(tmp_path / "c.toml"), load_config(tmp_path / "c.yaml")
    assert a == b
    assert a.router.port == 50123 and a.default_pool == "a-bf16"
    assert a.pools[1].num_gpus == 0.5 and a.pools[0].num_gpus is None


def test_defaults_serve_smollm2_bf16():
    c = ServeConfig()
    assert c.pools[0].model == "smollm2" and c.pools[0].kv_format == "bf16" and c.router.port == 50051


@pytest.mark.parametrize("data, words", [
    ({"pools": [{"name": "p", "kv_fromat": "bf16"}]}, ["kv_fromat", "pools[0]"]),
    ({"router": {"prot": 1}}, ["prot", "router"]),
    ({"pool": []}, ["pool"]),
    ({"pools": [{"name": "p", "kv_format": "fp5"}]}, ["kv_format", "fp5"]),
    ({"pools": [{"name": "p", "decode_workers": 0}]}, ["decode_workers"]),
    ({"pools": [{"name": "p"}, {"name": "p"}]}, ["unique", "p"]),
    ({"router": {"default_pool": "x"}, "pools": [{"name": "p"}]}, ["default_pool", "x"]),
    ({"router": {"port": 70000}}, ["port"]),
    ({"router": {"port": "any"}}, ["router.port"]),
    ({"router": {"metrics_port": "auto"}}, ["metrics_port", "'any'", "'auto'"]),
    ({"router": {"metrics_port": True}}, ["metrics_port"]),
    ({"pools": [{"name": "p", "gpus_per_worker": "two"}]}, ["gpus_per_worker"]),
    ({"pools": [{"name": "p", "transport": "tcp"}]}, ["transport"]),
    ({"pools": [{"name": "p", "transfer_progress_delay_us": 0}]}, ["transfer_progress_delay_us", "spin"]),
    ({"pools": [{"name": "p", "transfer_progress_delay_us": 1.5}]}, ["transfer_progress_delay_us"]),
    ({"pools": []}, ["at least one pool"]),
    ({"router": {"drain_timeout_s": -1}}, ["drain_timeout_s", "0 to 3600"]),
    ({"pools": [{"name": "p", "hung_worker_s": 0}]}, ["hung_worker_s", "1 to 86400"]),
    ({"router": {"drain_timeout_s": "30s"}}, ["drain_timeout_s", "'30s'"]),
    ({"router": {"drain_timeout_s": float("nan")}}, ["drain_timeout_s"]),
    # wrong types failed later, with an AttributeError traceback, or passed (true as 1 page)
    ({"pools": [{"name": "p", "kv_format": 4}]}, ["kv_format must be a string", "4"]),
    ({"pools": [{"name": "p", "device": None}]}, ["device must be a string", "None"]),
    ({"pools": [{"name": "p", "model": 5}]}, ["model must be a string"]),
    ({"pools": [{"name": 5}]}, ["name must be a string"]),
    ({"pools": [{"name": "p", "num_pages": True}]}, ["num_pages", "True"]),
    ({"router": {"host": 5}}, ["host must be a string"]),
    ({"router": {"max_inflight": True}}, ["max_inflight", "True"]),
    ({"router": {"request_timeout_s": "x"}}, ["request_timeout_s", "'x'"]),
    ({"router": {"request_timeout_s": float("inf")}}, ["request_timeout_s", "inf"]),
])
def test_mistakes_name_the_key(data, words):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    for word in words:
        assert word in str(err.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[router\nport = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "bad.toml")
    (tmp_path / "c.ini").write_text("")
    with pytest.raises(ConfigError, match="toml"):
        load_config(tmp_path / "c.ini")


def test_keys_are_the_dataclass_fields():
    keys = config_keys()
    assert "kv_format" in keys["pools"] and "max_queue" in keys["router"]
    assert PoolConfig("x").name == "x"


def test_auto_gpus_share_one_gpu(monkeypatch):
    """On a one-GPU machine the default pool's two workers get half a GPU each; CPU pools none."""
    import ray

    from router.serve import auto_gpus_per_worker
    from router.workers import WorkerFactory

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 1.0, "CPU": 16.0})
    assert auto_gpus_per_worker(ServeConfig()) == 0.5
    two = ServeConfig(pools=(PoolConfig("a"), PoolConfig("b", kv_format="nvfp4", decode_workers=2)))
    assert auto_gpus_per_worker(two) == pytest.approx(0.2)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 8.0})
    assert auto_gpus_per_worker(two) == 1.0
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    assert auto_gpus_per_worker(ServeConfig()) == 0.0
    assert WorkerFactory(PoolConfig("c", device="cpu"), auto_gpus=0.5).num_gpus == 0.0
    assert WorkerFactory(PoolConfig("g", gpus_per_worker=0.25), auto_gpus=0.5).num_gpus == 0.25


def test_metrics_port_any_is_accepted():
    assert parse_config({"router": {"metrics_port": "any"}}).router.metrics_port == "any"
