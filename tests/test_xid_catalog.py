"""trainguard's Xid catalog against NVIDIA's reference export, and the classes that matter most."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from real_parts import require_real
from trainguard.actions import Advice
from trainguard.detect.xid import XidClass, xid_catalog, xid_info
from trainguard.records import Category, Severity

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "xid" / "xid_catalog.csv"
GENERATIONS = ("A100", "H100", "B100", "GB200")


def _reference_rows() -> list[dict[str, str]]:
    require_real(
        "NVIDIA's Xid catalog (../shared/reference/xid)",
        install=f"check out the project's shared folder beside the repository, so that {REFERENCE} exists",
        found=REFERENCE.is_file(),
    )
    with REFERENCE.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_catalog_covers_every_reference_code_with_the_same_mnemonic_and_buckets():
    rows = _reference_rows()
    catalog = xid_catalog()
    assert len(rows) > 150
    for row in rows:
        code = int(row["Code"])
        assert code in catalog, f"Xid {code} missing from the project catalog"
        info = catalog[code]
        assert info.mnemonic == row["Mnemonic"].strip(), code
        assert info.immediate == row["Resolution Bucket (Immediate Action)"].strip(), code
        assert info.investigatory == row["Resolution Bucket (Investigatory Action)"].strip(), code
        gens = tuple(g for g in GENERATIONS if row[f"Applies to {g}"].strip().upper() == "YES")
        assert info.generations == gens, code


def test_descriptions_are_our_own_words_not_nvidias():
    rows = {int(r["Code"]): r["Description"].strip() for r in _reference_rows()}
    copied = [code for code, text in rows.items() if len(text) > 25 and xid_info(code).description == text]
    assert copied == []


# Where a training fleet acts differently from NVIDIA's immediate bucket (tools/gen_xid_catalog.py).
POLICY_ACTIONS = {
    46: Advice.RESET_GPU,
    63: Advice.RESET_GPU,  # the remap is recorded; it takes effect at the next GPU reset
    64: Advice.CONTACT_SUPPORT,
    74: Advice.RUN_DIAGNOSTICS,
    92: Advice.CONTACT_SUPPORT,
    94: Advice.RESET_GPU,
    109: Advice.RESET_GPU,
    110: Advice.RESET_GPU,
    136: Advice.RESET_GPU,
    154: Advice.NONE,
    155: Advice.RESET_GPU,
    156: Advice.RESET_GPU,
}


def test_action_follows_the_immediate_bucket_unless_the_fleet_policy_says_otherwise():
    by_bucket = {
        "RESTART_APP": Advice.RESTART_APP,
        "RESET_GPU": Advice.RESET_GPU,
        "RESTART_BM": Advice.REBOOT_NODE,
        "CONTACT_SUPPORT": Advice.CONTACT_SUPPORT,
        "IGNORE": Advice.IGNORE,
    }
    for info in xid_catalog().values():
        if info.code in POLICY_ACTIONS:
            assert info.action is POLICY_ACTIONS[info.code], info.code
        elif info.immediate in by_bucket:
            assert info.action is by_bucket[info.immediate], info.code
    assert xid_info(48).action is Advice.RESET_GPU  # WORKFLOW_XID_48
    assert xid_info(45).action is Advice.RESTART_APP  # solo; a sympathetic 45 is downgraded by the scanner


@pytest.mark.parametrize(
    ("codes", "cls"),
    [
        ((13, 31, 43, 68, 109), XidClass.APPLICATION),
        ((45,), XidClass.SYMPATHETIC),
        ((48, 63, 64, 92, 94, 95), XidClass.MEMORY),
        ((74, 144, 145, 146, 147, 148, 149, 150), XidClass.INTERCONNECT),
        ((79,), XidClass.HARDWARE),
        ((119, 120), XidClass.FIRMWARE_DRIVER),
        ((154,), XidClass.RECOVERY_ACTION),
    ],
)
def test_key_codes_have_the_right_class(codes, cls):
    assert [xid_info(c).xid_class for c in codes] == [cls] * len(codes)


def test_xid_79_fails_the_gpu_and_reboots_the_node():
    info = xid_info(79)
    assert info.fatal and info.severity is Severity.FATAL
    assert info.action is Advice.REBOOT_NODE
    assert info.category is Category.GPU_HARDWARE


def test_memory_errors_land_in_the_ecc_category():
    assert {xid_info(c).category for c in (48, 63, 64, 92, 94, 95)} == {Category.GPU_MEMORY_ECC}
    assert xid_info(95).fatal and not xid_info(94).fatal


def test_application_xids_do_not_take_the_gpu_out_on_first_sight():
    for code in (13, 31, 43):
        assert xid_info(code).severity in (Severity.INFO, Severity.WARNING)
        assert xid_info(code).action in (Advice.RESTART_APP, Advice.IGNORE)


@pytest.mark.parametrize("code", [0, 9999, -3, 2**70])
def test_unknown_codes_get_an_unknown_entry_instead_of_raising(code):
    info = xid_info(code)
    assert not info.known
    assert info.xid_class is XidClass.UNKNOWN
    assert info.action is Advice.CONTACT_SUPPORT


def test_catalog_is_loaded_once():
    assert xid_catalog() is xid_catalog()


def test_packaged_catalog_is_what_the_generator_produces():
    import importlib.util

    _reference_rows()  # skips without the reference
    tool = Path(__file__).resolve().parents[1] / "tools" / "gen_xid_catalog.py"
    spec = importlib.util.spec_from_file_location("gen_xid_catalog", tool)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    packaged = (Path(__file__).resolve().parents[1] / "src/trainguard/detect/data/xid_catalog.csv").read_text(
        "utf-8"
    )
    assert module.render(REFERENCE) == packaged, "run: python tools/gen_xid_catalog.py"


@pytest.mark.parametrize("code", sorted(xid_catalog()))
def test_the_parser_the_xid_rules_and_the_root_cause_read_one_table(code):
    from trainguard.detect.kernel_log import parse_kernel_line
    from trainguard.detect.xid_rules import xid_policy
    from trainguard.incidents import xid_root_cause

    info = xid_info(code)
    event = parse_kernel_line(f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=7, name=python, something")
    assert event is not None and event.action is info.action and event.category is info.category
    health, action = xid_policy(code, event, app_xids=())
    if info.health is not None:
        assert (health, action) == (info.health, info.action)
    cause = xid_root_cause(code)
    assert (cause.value if cause else info.root_cause) in (info.root_cause, "symptom", "")


def test_xid_94_fails_the_gpu_everywhere_and_xid_63_asks_for_a_reset():
    from trainguard.detect.xid_rules import xid_policy
    from trainguard.incidents import RootCause, xid_root_cause
    from trainguard.records import Health

    assert xid_info(94).action is Advice.RESET_GPU and xid_policy(94) == (Health.FAILED, Advice.RESET_GPU)
    assert xid_root_cause(94) is RootCause.GPU_HBM_MEMORY
    assert xid_policy(63) == (Health.OK, Advice.RESET_GPU)  # healthy, but the remap waits for a reset
