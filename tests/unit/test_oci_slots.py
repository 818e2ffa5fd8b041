"""The pure parts of the attempt networks kept for reuse (services/worker/oci/slots.py): their names, which
address a new one takes, how many are kept, and what counts as residue. The slots themselves are tested
for real in tests/oci/test_oci_network_slots.py."""

from __future__ import annotations

from ipaddress import IPv4Network

from hypothesis import given
from hypothesis import strategies as st

from services.worker.oci.network import PRIVATE, PUBLIC, Plan, owner_hash
from services.worker.oci.slots import Demand, first_free_index, neighbours, netns_name, residue, slot_of, veth_name

PLAN = Plan("0a1b2c3d", IPv4Network("10.199.7.0/24"))
INDEXES = st.integers(0, len(PLAN.addresses(PUBLIC)) - 1)


@given(st.sampled_from([PUBLIC, PRIVATE]), INDEXES, st.text(min_size=1))
def test_slot_names_fit_the_kernel_and_come_back_to_their_owner(mode: str, index: int, owner_dir: str) -> None:
    h = owner_hash(owner_dir)  # as the worker's bridges': of its state directory
    netns, veth = netns_name(h, mode, index), veth_name(h, mode, index)
    assert len(veth) <= 15  # IFNAMSIZ - 1
    assert slot_of(h, netns) == slot_of(h, veth) == f"{'p' if mode == PUBLIC else 'v'}{index:02x}"
    assert slot_of(owner_hash(owner_dir + "x"), netns) is None  # another state root's worker
    assert slot_of(h, f"crl-{h}-p") is None and slot_of(h, f"crl-{h}-v") is None  # the bridges are not slots


def test_both_modes_take_every_address_of_their_25() -> None:
    assert len(PLAN.addresses(PUBLIC)) == len(PLAN.addresses(PRIVATE)) == 125
    assert len({veth_name(PLAN.hash, m, i) for m in (PUBLIC, PRIVATE) for i in range(125)}) == 250


@given(st.sets(INDEXES))
def test_a_new_slot_takes_the_lowest_address_no_slot_holds(taken: set[int]) -> None:
    index = first_free_index(taken, 125)
    if len(taken) == 125:
        assert index is None
    else:
        assert index is not None and index not in taken and all(i in taken for i in range(index))


@given(st.lists(st.tuples(st.floats(0, 30), st.integers(0, 20)), min_size=1, max_size=30), st.floats(0, 100))
def test_demand_is_the_most_attempts_at_once_in_the_window(steps: list[tuple[float, int]], later_s: float) -> None:
    """The peak of the step function 'attempts at once' over the last window_s, however it was noted."""
    demand, now, changes = Demand(window_s=60), 0.0, []
    for gap_s, running in steps:
        now += gap_s
        demand.note(now, running)
        changes.append((now, running))
    now += later_s
    ends = [at for at, _ in changes[1:]] + [now]  # each count holds until the next change
    held = [running for (_, running), until in zip(changes, ends) if until > now - 60]
    held.append(changes[-1][1])  # the count now
    assert demand.peak(now) == max(held)
    assert demand.peak(now) >= changes[-1][1]


def test_residue_counts_every_socket_but_the_headers() -> None:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    time_wait = "   0: 0200C70A:A2F0 02643CC6:1F90 06 00000000:00000000 03:00001770 00000000     0 0 0\n"
    unix = "Num       RefCount Protocol Flags    Type St Inode Path\n"
    assert residue({"tcp": header, "udp": header, "unix": unix}) == []
    assert residue({"tcp": header + time_wait, "udp": header, "unix": unix + "0000: 00000002 0 0 1 1 1 @x\n" * 2}) \
        == ["1 tcp socket", "2 unix sockets"]


def test_neighbours_are_read_from_the_arp_table() -> None:
    arp = ("IP address       HW type     Flags       HW address            Mask     Device\n"
           "10.199.7.1       0x1         0x2         ee:11:22:33:44:55     *        eth0\n"
           "10.199.7.9       0x1         0x0         00:00:00:00:00:00     *        eth0\n")
    assert neighbours(arp) == ["10.199.7.1", "10.199.7.9"]
    assert neighbours(arp.splitlines()[0]) == []
