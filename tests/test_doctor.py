"""`cxlhm doctor --engine lmcache CONFIG` against LMCache's own config reader and plug-in
loading: a good config passes and opens the device; each mistake LMCache would swallow
(and run without the tier) is the one line it prints."""
import json

import engines  # noqa: F401 - imports the engines
import pytest

from cxlhm_apps.cli import main


def write_config(tmp_path, *, module="host_runtime.shim.lmcache", cls="CxlhmRemoteConnector", device=True, **extra):
    dev = {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
           "backend": {"path": str(tmp_path / "kv-{worker_id}.img")}}
    extra_config = {"remote_storage_plugin.cxlhm.module_path": module,
                    "remote_storage_plugin.cxlhm.class_name": cls, "remote_storage_plugin.cxlhm.hints": "none", **extra}
    if device:
        extra_config["remote_storage_plugin.cxlhm.device"] = dev
    path = tmp_path / "lmcache.yaml"
    path.write_text("chunk_size: 256\nlocal_cpu: false\nmax_local_cpu_size: 1\n"
                    "remote_storage_plugins: [cxlhm]\n"
                    f"extra_config: {json.dumps(extra_config)}\n")  # JSON is YAML
    return str(path)


def doctor(capsys, *argv):
    code = main(["doctor", "--engine", "lmcache", *argv])
    return code, capsys.readouterr().out


def test_a_good_config_loads_the_tier_and_opens_the_device(tmp_path, capsys):
    code, out = doctor(capsys, write_config(tmp_path))
    assert code == 0, out
    assert "device opened: 4194304 bytes" in out and "tenant 'lmcache'" in out and "FAIL" not in out
    assert (tmp_path / "kv-0.img").exists()


@pytest.mark.parametrize("mistake, said", [
    (dict(module="host_runtime.shim.lmcach"), "module 'host_runtime.shim.lmcach' does not import: ModuleNotFoundError"),
    (dict(cls="CxlhmConnector"), "has no 'CxlhmConnector'"),
    (dict(module="host_runtime.shim.api", cls="KVShim"), "is not an LMCache RemoteConnector"),
    (dict(device=False), "no remote_storage_plugin.cxlhm.device"),
    (dict(**{"remote_storage_plugin.cxlhm.pin_budget": "lots"}), "pin_budget must be"),
])
def test_each_mistake_lmcache_would_swallow_is_named(tmp_path, capsys, mistake, said):
    code, out = doctor(capsys, write_config(tmp_path, **mistake))
    assert code == 2
    fail = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and said in fail[0], out


def test_a_device_that_cannot_be_opened_is_named_and_no_open_skips_it(tmp_path, capsys):
    path = write_config(tmp_path)
    text = open(path).read().replace(str(tmp_path / "kv-{worker_id}.img"), "/proc/no-such-dir/kv.img")
    open(path, "w").write(text)
    code, out = doctor(capsys, path)
    assert code == 2 and "building the connector fails" in out and "/proc/no-such-dir" in out
    code, out = doctor(capsys, path, "--no-open")
    assert code == 0 and "cxlhm settings" in out


def test_a_missing_or_unreadable_config_is_named(tmp_path, capsys):
    code, out = doctor(capsys, str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such file" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("chunk_size: [unclosed\n")
    code, out = doctor(capsys, str(bad))
    assert code == 2 and "LMCache cannot read it" in out


def test_the_legacy_external_url_is_checked_too(tmp_path, capsys):
    dev = {"capacity": "4MiB", "block_size": "4KiB", "dram_bytes": "32KiB",
           "backend": {"path": str(tmp_path / "ext.img")}}
    path = tmp_path / "ext.yaml"
    url = "external://host:0/host_runtime.shim.lmcache/?connector_name=CxlhmRemoteConnector"
    path.write_text(f"chunk_size: 256\nlocal_cpu: false\nmax_local_cpu_size: 1\nremote_url: {json.dumps(url)}\n"
                    f"extra_config: {json.dumps({'cxlhm.device': dev, 'cxlhm.hints': 'none'})}\n")
    code, out = doctor(capsys, str(path))
    assert code == 0 and "remote_url" in out and "device opened" in out, out
    path.write_text(path.read_text().replace("?connector_name=CxlhmRemoteConnector", ""))
    code, out = doctor(capsys, str(path))
    assert code == 2 and "needs ?connector_name" in out
