"""The emulator's parsers of what is written to resctrl files, against the kernel's rules
(fs/resctrl/rdtgroup.c, ctrlmondata.c, lib/kstrtox.c), on the kernel model itself: any
bytes either do what the kernel does or fail with its errno, never with another error."""

import errno

from hypothesis import given
from hypothesis import strategies as st

from nodesim.resctrl_emulator.kernel import KernelError, ResctrlKernel, kstrtoint
from nodesim.resctrl_emulator.profiles import PROFILES


def kernel(profile="intel", **kw):
    return ResctrlKernel(PROFILES[profile], clock=lambda: 0.0, **kw)


@given(st.integers(-(1 << 31), (1 << 31) - 1))
def test_kstrtoint_reads_decimal_hex_and_octal(n):
    sign = "-" if n < 0 else ""
    for text in (str(n), f"{sign}{abs(n):#x}", f"{sign}0{abs(n):o}", f"{n}\n"):
        assert kstrtoint(text) == n, text


@given(st.text())
def test_kstrtoint_never_raises(text):
    v = kstrtoint(text)
    assert v is None or -(1 << 31) <= v < (1 << 31)


def test_kstrtoint_refuses_what_the_kernel_refuses():
    for text in ("", "-", "+", "1_0", "0x", "08", " 1", "1 ", "1\n\n", "2147483648", "-+1", "١"):
        assert kstrtoint(text) is None, text
    assert kstrtoint("+7") == 7 and kstrtoint("-2147483648") == -(1 << 31)


@given(st.binary(max_size=40))
def test_schemata_writes_succeed_or_fail_with_einval(data):
    for profile in ("intel", "intel-mbps", "amd"):
        k = kernel(profile)
        k.mkdir(["g"])
        before = {res: dict(v) for res, v in k.groups["g"].ctrl.items()}
        try:
            k.write(["g", "schemata"], data, caller_pid=1, caller_uid=0)
        except KernelError as e:
            assert e.errno == errno.EINVAL
            assert k.groups["g"].ctrl == before  # all or nothing


@given(st.text(alphabet="0123456789+-x ", max_size=30))
def test_mb_values_read_as_kstrtou32(value):
    k = kernel("intel-mbps")
    k.mkdir(["g"])
    digits = value.strip()[1:] if value.strip().startswith("+") else value.strip()
    try:
        k.write(["g", "schemata"], f"MB:0={value}\n".encode(), caller_pid=1, caller_uid=0)
    except KernelError as e:
        assert e.errno == errno.EINVAL
        assert not (digits.isdigit() and int(digits) < 1 << 32)
    else:
        assert k.groups["g"].ctrl["MB"][0] == int(digits) < 1 << 32


@given(st.binary(max_size=40))
def test_cpus_writes_succeed_or_fail_with_einval(data):
    k = kernel("intel")
    k.mkdir(["g"])
    k.mkdir(["g", "mon_groups", "m"])
    for path in (["cpus"], ["cpus_list"], ["g", "cpus_list"], ["g", "mon_groups", "m", "cpus"]):
        try:
            k.write(path, data, caller_pid=1, caller_uid=0)
        except KernelError as e:
            assert e.errno == errno.EINVAL
        # the invariants of rdtgroup.c: each CPU in exactly one control group, a MON
        # group's CPUs inside its parent's
        groups = [k.root, *k.groups.values()]
        assert set().union(*(g.cpus for g in groups)) == k.all_cpus
        assert sum(len(g.cpus) for g in groups) == len(k.all_cpus)
        for g in groups:
            for m in g.mon.values():
                assert m.cpus <= g.cpus
