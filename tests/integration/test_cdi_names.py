"""`cdi check` reads a spec's device names with the hook's grammar (ponytail.plan.select): a name
the hook resolves is never "not on this host any more" to the check."""

from __future__ import annotations

from support.fakehost import FakeHost


def test_cdi_check_reads_device_names_as_the_hook_does(shared_host: FakeHost) -> None:
    from ponytail.cdi.files import generate, stale
    from ponytail.config import load_config

    config = load_config(str(shared_host.write_config()), True)
    spec, _, _ = generate(config, "/bin/true", "both", "all", None)
    assert stale(spec, config) == []
    for device in spec["devices"]:  # the hook takes a UUID in any case, and a GPU by its bus id
        if device["name"].startswith("GPU-"):
            device["name"] = device["name"].upper()
    bus_ids = [g.bus_id for g in shared_host.gpu_list]
    spec["devices"].append({**spec["devices"][0], "name": bus_ids[0]})
    assert stale(spec, config) == [], stale(spec, config)
    spec["devices"].append({**spec["devices"][0], "name": "7"})  # no GPU 7 here: still said
    assert stale(spec, config) == ["device 7 is not on this host any more"]


def test_the_grammar_is_select_devices_own() -> None:
    from ponytail.container.request import DeviceRequest
    from ponytail.errors import InputError
    from ponytail.plan.select import find_device, select_devices

    from support.hostdata import make_host

    gpus = make_host().gpus
    for name in ("0", "1", gpus[1].uuid.upper(), gpus[0].pci_bus_id, gpus[0].pci_bus_id[5:], "9", "GPU-nope", "all"):
        found = find_device(gpus, name)
        try:
            selected = select_devices(gpus, DeviceRequest(name, "test")).gpus
        except InputError:  # an unknown name: the hook refuses it
            selected = ()
        expected = selected[0] if selected and name != "all" else None
        assert found == expected, name
