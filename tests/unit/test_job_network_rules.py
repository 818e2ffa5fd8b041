"""The containers' iptables rules of several workers on one host, evaluated as the kernel's filter table
would, whatever order the workers started in (issue 33, part 1).

Each worker inserts its jumps at the top of the host's chains, so a packet between two workers' bridges
meets the chain of whichever started last. `Host` below keeps the host's chains exactly as `HostNetwork`
leaves them (`-I CHAIN 1` for each jump in turn; a stopped worker's jumps removed) and evaluates a packet
through them; the host's own policy is ACCEPT, the worst case. The properties are the rows of the table
"What a job can reach" in docs/security.md, for every order of start and stop: the real rules are tried
from real containers in tests/oci/test_oci_network.py."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

from hypothesis import given, settings
from hypothesis import strategies as st

from services.worker.oci.network import NON_PUBLIC, PRIVATE, PUBLIC, SUBNETS, Plan

UPLINK = "eth0"
"""The host's interface towards the internet and the deployment's private machines."""
HOST_CHAINS = {"INPUT", "FORWARD", "OUTPUT"}


@dataclass(frozen=True)
class Packet:
    hook: str
    """INPUT (to the host), FORWARD (through it) or OUTPUT (from the host's own processes)."""
    src: IPv4Address
    dst: IPv4Address
    in_iface: str = ""
    out_iface: str = ""
    state: str = "NEW"


def matches(rule: list[str], packet: Packet) -> str:
    """The rule's target if it matches `packet`, else ''. Refuses options it does not know, so that a new
    kind of rule cannot pass unexamined."""
    words, negate, i = list(rule), False, 0
    while i < len(words):
        word = words[i]
        if word == "!":
            negate, i = True, i + 1
            continue
        if word == "-j":
            return words[i + 1]
        if word == "-m" and words[i + 1] == "conntrack" and words[i + 2] == "--ctstate":
            ok = packet.state in words[i + 3].split(",")
            i += 4
        elif word in ("-i", "-o"):
            ok = (packet.in_iface if word == "-i" else packet.out_iface) == words[i + 1]
            i += 2
        elif word in ("-s", "-d"):
            ok = (packet.src if word == "-s" else packet.dst) in IPv4Network(words[i + 1])
            i += 2
        else:
            raise AssertionError(f"the evaluator does not know {word!r} in {rule}")
        if ok == negate:
            return ""
        negate = False
    raise AssertionError(f"no target in {rule}")


@dataclass
class Host:
    """The host's filter table as the workers' set-ups and tear-downs leave it."""

    chains: dict[str, list[list[str]]] = field(default_factory=lambda: {c: [] for c in HOST_CHAINS})
    ours: dict[str, list[list[str]]] = field(default_factory=dict)

    def start(self, plan: Plan) -> None:
        for table, chain, rule in plan.rules():
            if table == "filter":
                self.ours.setdefault(chain, []).append(rule)
        for table, chain, rule in plan.jumps():
            if table == "filter":
                self.chains[chain].insert(0, rule)  # `iptables -I CHAIN 1`, as HostNetwork.set_up does

    def stop(self, plan: Plan) -> None:
        for table, chain, rule in plan.jumps():
            if table == "filter":
                self.chains[chain].remove(rule)
        for kind in ("IN", "FWD", "OUT"):
            self.ours.pop(plan.chain(kind), None)

    def verdict(self, packet: Packet) -> str:
        for jump in self.chains[packet.hook]:
            if target := matches(jump, packet):
                for rule in self.ours[target]:
                    if (final := matches(rule, packet)) in ("ACCEPT", "DROP"):
                        return final
                    assert not final, f"a rule of ours jumps to {final}"
        return "ACCEPT"  # the host's policy, at its most permissive


PRIVATE_CHOICES = [(), (IPv4Network("10.197.77.0/24"),), (IPv4Network("10.0.0.0/8"),),
                   (IPv4Network("192.168.0.0/16"), IPv4Network("203.0.113.0/24"))]
"""Deployments' private ranges: none, a narrow one, one that holds every worker's bridges, and one of
public addresses (a range may be anything the operator names)."""


@st.composite
def hosts(draw: st.DrawFn) -> tuple[Host, list[Plan]]:
    """2 to 4 workers (of one or several deployments, with their own private ranges) started in any order,
    perhaps one stopped again; the plans of those still running."""
    n = draw(st.integers(2, 4))
    subnets = draw(st.lists(st.integers(0, 255), min_size=n, max_size=n, unique=True))
    plans = [Plan(f"{i:08x}", IPv4Network(f"10.199.{s}.0/24"), draw(st.sampled_from(PRIVATE_CHOICES)))
             for i, s in enumerate(subnets)]
    host = Host()
    for plan in draw(st.permutations(plans)):
        host.start(plan)
    if draw(st.booleans()):
        stopped = draw(st.sampled_from(plans))
        host.stop(stopped)
        plans.remove(stopped)
    return host, plans


def job(plan: Plan, mode: str, index: int = 0) -> tuple[IPv4Address, str]:
    """A job's address and its bridge."""
    addresses = plan.addresses(mode)
    return addresses[index % len(addresses)], plan.bridge(mode)


internet = st.ip_addresses(v=4).filter(lambda a: not any(a in n for n in NON_PUBLIC))


@settings(max_examples=100)
@given(hosts(), st.integers(0, 200), st.integers(0, 200))
def test_no_job_starts_a_connection_to_a_job_of_another_bridge(world: tuple[Host, list[Plan]], i: int,
                                                               j: int) -> None:
    host, plans = world
    bridges = [(plan, mode) for plan in plans for mode in (PUBLIC, PRIVATE)]
    for source_plan, source_mode in bridges:
        for target_plan, target_mode in bridges:
            if (source_plan, source_mode) == (target_plan, target_mode):
                continue  # one bridge: its ports are isolated from each other (tests/oci)
            src, in_iface = job(source_plan, source_mode, i)
            dst, out_iface = job(target_plan, target_mode, j)
            packet = Packet("FORWARD", src, dst, in_iface, out_iface)
            assert host.verdict(packet) == "DROP", (packet, host.chains["FORWARD"])
            # Nor to a bridge's gateway: the host itself, by a job network's address.
            to_gateway = Packet("INPUT", src, target_plan.gateway(target_mode), in_iface)
            assert host.verdict(to_gateway) == "DROP", to_gateway


@settings(max_examples=100)
@given(hosts(), st.integers(0, 200), internet)
def test_the_hosts_own_processes_start_no_connection_to_a_job(world: tuple[Host, list[Plan]], i: int,
                                                              outside: IPv4Address) -> None:
    host, plans = world
    for plan in plans:
        for mode in (PUBLIC, PRIVATE):
            dst, bridge = job(plan, mode, i)
            assert host.verdict(Packet("OUTPUT", plan.gateway(mode), dst, out_iface=bridge)) == "DROP"
            # ... but answer what a job started (a private job's connection to the host, say).
            reply = Packet("OUTPUT", plan.gateway(mode), dst, out_iface=bridge, state="ESTABLISHED")
            assert host.verdict(reply) == "ACCEPT"
            # Replies from the world to a job's own connections come back.
            back = Packet("FORWARD", outside, dst, UPLINK, bridge, state="ESTABLISHED")
            assert host.verdict(back) == "ACCEPT"


@settings(max_examples=100)
@given(hosts(), st.integers(0, 200), internet, st.ip_addresses(v=4))
def test_a_public_job_reaches_the_internet_and_no_other_range(world: tuple[Host, list[Plan]], i: int,
                                                              outside: IPv4Address, anywhere: IPv4Address) -> None:
    host, plans = world
    for plan in plans:
        src, bridge = job(plan, PUBLIC, i)
        if not any(outside in n for n in plan.private_networks):
            assert host.verdict(Packet("FORWARD", src, outside, bridge, UPLINK)) == "ACCEPT"
        refused = (any(anywhere in n for n in NON_PUBLIC + plan.private_networks)
                   or anywhere in SUBNETS)
        verdict = host.verdict(Packet("FORWARD", src, anywhere, bridge, UPLINK))
        assert verdict == ("DROP" if refused else "ACCEPT"), (anywhere, verdict)
        # The host itself, by any address: nothing.
        assert host.verdict(Packet("INPUT", src, anywhere, bridge)) == "DROP"


@settings(max_examples=100)
@given(hosts(), st.integers(0, 200), st.ip_addresses(v=4))
def test_a_private_job_reaches_its_deployments_private_ranges_only(world: tuple[Host, list[Plan]], i: int,
                                                                   anywhere: IPv4Address) -> None:
    host, plans = world
    for plan in plans:
        src, bridge = job(plan, PRIVATE, i)
        allowed = any(anywhere in n for n in plan.private_networks) and anywhere not in SUBNETS
        assert host.verdict(Packet("FORWARD", src, anywhere, bridge, UPLINK)) == ("ACCEPT" if allowed else "DROP")
        # The host's own addresses in those ranges (and none of the job networks' gateways).
        assert host.verdict(Packet("INPUT", src, anywhere, bridge)) == ("ACCEPT" if allowed else "DROP")


def test_without_the_drops_of_this_change_the_newer_worker_reaches_the_older_ones_job() -> None:
    """The evaluator can fail: with the rules as they were before issue 33 (no drop of SUBNETS nor of the
    non-public ranges), the newest worker's accept of its own public range matched before the older
    worker's refusal, and its job reached the older worker's."""
    older, newer = (Plan(f"{i:08x}", IPv4Network(f"10.199.{i}.0/24")) for i in (1, 2))
    host = Host()
    for plan in (older, newer):
        host.start(plan)
    added = [["-d", str(SUBNETS), "-j", "DROP"]] + [["-i", newer.bridge(PUBLIC), "-d", str(n), "-j", "DROP"]
                                                   for n in NON_PUBLIC if n != ipaddress.IPv4Network("169.254.0.0/16")]
    host.ours[newer.chain("FWD")] = [r for r in host.ours[newer.chain("FWD")] if r not in added]
    (src, in_iface), (dst, out_iface) = job(newer, PUBLIC), job(older, PUBLIC)
    assert host.verdict(Packet("FORWARD", src, dst, in_iface, out_iface)) == "ACCEPT"
