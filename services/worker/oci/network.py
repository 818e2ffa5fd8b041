"""The networks of one worker's containers: NETWORK_MODE_PUBLIC and PRIVATE
(NONE needs nothing of the host: runc makes an empty namespace).

Per worker (its owner name, hashed to H, 8 hex digits), made when the
runtime starts and removed when it closes or by whoever cleans up after it:

- a /24 of 10.199.0.0/16 (chosen from H, skipping one the host already
  routes or another runtime under the state root claims), split in two:
  the first /25 is the public bridge's, the second the private bridge's;
- two Linux bridges, `crl-H-p` (public) and `crl-H-v` (private), each with
  its /25's first address as the gateway; IPv6 off on them (else a job would
  reach the host over link-local IPv6, out of iptables' sight);
- iptables chains of its own, jumped to from the host's chains for the
  bridges' traffic only: `CORRAL-H-IN` (filter INPUT: nothing of the host
  itself, but for private, the host's addresses in the deployment's private
  ranges), `CORRAL-H-FWD` (filter FORWARD: public anywhere but the
  non-public ranges, `NON_PUBLIC`, and the deployment's private ranges;
  private only the private ranges; nobody starts a connection to a job),
  `CORRAL-H-OUT` (filter OUTPUT: the host's own processes, another local
  account's included, start no connection to a job either), `CORRAL-H-NAT`
  (nat POSTROUTING: MASQUERADE out of anything but the bridge).

**Order-independence.** Several workers, of one deployment or of several,
may share a host, and each inserts its jumps at the top of the host's
chains, so a packet between two workers' bridges meets whichever worker's
chain was inserted last. Both chains must therefore refuse it on their own:
each drops anything addressed to `SUBNETS` (every worker's bridges, of every
deployment: they all take their /24 from it) before it accepts anything,
and accepts towards its own bridges only replies. No rule of one worker's
accepts traffic for another's bridge, whatever order they start and stop in.

Per attempt: a slot of slots.py, a network namespace with a veth pair on
the mode's bridge and an address of its /25, kept for the next attempt
after a reset (its names from H too).

Which mode gets what is the pure part (`Plan`: names, addresses, rules);
`HostNetwork` runs `ip` and `iptables`.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

SUBNETS = ipaddress.IPv4Network("10.199.0.0/16")
"""Where workers' subnets come from (a /24 each)."""
LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")
"""Refused to public jobs: the cloud metadata address 169.254.169.254 is in it."""
NON_PUBLIC = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8",        # "this network"
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # RFC 1918: other machines of the site, other bridges
    "100.64.0.0/10",    # RFC 6598 shared address space (carrier-grade NAT, some clouds' internal ranges)
    "127.0.0.0/8",      # loopback (unroutable from a bridge anyway: route_localnet is off)
    str(LINK_LOCAL),    # link-local, the metadata server's
    "224.0.0.0/4",      # multicast
    "240.0.0.0/4",      # reserved, and the broadcast address
))
"""What a public job may not reach: every range that is not the internet. A deployment's own private ranges
(`--private-networks`) are refused to public jobs too, whatever their addresses."""
FALLBACK_RESOLVERS = ("1.1.1.1", "8.8.8.8")
"""A public job's resolvers when the host's resolv.conf names none a job can reach (e.g. only 127.0.0.53)."""
NETNS_DIR = Path("/var/run/netns")
PUBLIC, PRIVATE = "public", "private"
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class NetworkError(Exception):
    """The host's network could not be set up (or torn down) as asked; the words say which command and why."""


def owner_hash(owner_dir: Path) -> str:
    """8 hex digits naming an owner's bridges and chains: of its state directory, so that runtimes of one
    name under two state roots (whose locks do not see each other) do not share them."""
    return hashlib.sha256(str(owner_dir).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class Plan:
    """One worker's network: names, addresses and iptables rules (pure)."""

    hash: str
    subnet: ipaddress.IPv4Network
    """The worker's /24."""
    private_networks: tuple[ipaddress.IPv4Network, ...] = ()

    def bridge(self, mode: str) -> str:
        return f"crl-{self.hash}-{'p' if mode == PUBLIC else 'v'}"

    def mode_subnet(self, mode: str) -> ipaddress.IPv4Network:
        halves = list(self.subnet.subnets(prefixlen_diff=1))
        return halves[0] if mode == PUBLIC else halves[1]

    def gateway(self, mode: str) -> ipaddress.IPv4Address:
        return self.mode_subnet(mode).network_address + 1

    def addresses(self, mode: str) -> list[ipaddress.IPv4Address]:
        """What attempts of `mode` may get (the gateway aside)."""
        return list(self.mode_subnet(mode).hosts())[1:]

    @property
    def chains(self) -> dict[str, tuple[str, str]]:
        """Our chain per (table, host chain)."""
        return {"IN": ("filter", "INPUT"), "FWD": ("filter", "FORWARD"), "OUT": ("filter", "OUTPUT"),
                "NAT": ("nat", "POSTROUTING")}

    def chain(self, kind: str) -> str:
        return f"CORRAL-{self.hash}-{kind}"

    def jumps(self) -> list[tuple[str, str, list[str]]]:
        """(table, host chain, rule) sending the bridges' traffic, and only theirs, to our chains."""
        p, v = self.bridge(PUBLIC), self.bridge(PRIVATE)
        return ([("filter", "INPUT", ["-i", b, "-j", self.chain("IN")]) for b in (p, v)]
                + [("filter", "FORWARD", [d, b, "-j", self.chain("FWD")]) for b in (p, v) for d in ("-i", "-o")]
                + [("filter", "OUTPUT", ["-o", b, "-j", self.chain("OUT")]) for b in (p, v)]
                + [("nat", "POSTROUTING", ["-s", str(self.subnet), "-j", self.chain("NAT")])])

    def rules(self) -> list[tuple[str, str, list[str]]]:
        """(table, our chain, rule), in order."""
        p, v = self.bridge(PUBLIC), self.bridge(PRIVATE)
        sp, sv = str(self.mode_subnet(PUBLIC)), str(self.mode_subnet(PRIVATE))
        private = [str(n) for n in self.private_networks]
        into, forward, out, nat = self.chain("IN"), self.chain("FWD"), self.chain("OUT"), self.chain("NAT")
        jobs = str(SUBNETS)
        rules: list[tuple[str, str, list[str]]] = []
        # The host itself: nothing (its loopback services are out of reach anyway: route_localnet is off),
        # but a private job may reach the host's own addresses in the deployment's private ranges. Never a
        # bridge's gateway address, though a private range may hold SUBNETS: the host is reached there on
        # every service bound to all addresses.
        rules.append(("filter", into, ["-d", jobs, "-j", "DROP"]))
        rules += [("filter", into, ["-i", v, "-s", sv, "-d", n, "-j", "ACCEPT"]) for n in private]
        rules.append(("filter", into, ["-j", "DROP"]))
        # Replies to a job's connections come back; nothing else goes to a job, from anywhere.
        for bridge in (p, v):
            rules.append(("filter", forward, ["-o", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                                              "-j", "ACCEPT"]))
            rules.append(("filter", forward, ["-o", bridge, "-j", "DROP"]))
        # From here on, traffic came in from one of our bridges. Another worker's bridge (of this deployment
        # or another) is refused here, whichever worker's jump the host's FORWARD chain meets first.
        rules.append(("filter", forward, ["-d", jobs, "-j", "DROP"]))
        rules += [("filter", forward, ["-i", p, "-d", str(n), "-j", "DROP"]) for n in NON_PUBLIC]
        rules += [("filter", forward, ["-i", p, "-d", n, "-j", "DROP"]) for n in private]
        rules.append(("filter", forward, ["-i", p, "-s", sp, "-j", "ACCEPT"]))
        rules += [("filter", forward, ["-i", v, "-s", sv, "-d", n, "-j", "ACCEPT"]) for n in private]
        rules.append(("filter", forward, ["-j", "DROP"]))  # a forged source, or private beyond its ranges
        # The host's own processes answer a job (a private job's connection to the host) but start nothing.
        rules.append(("filter", out, ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]))
        rules.append(("filter", out, ["-j", "DROP"]))
        rules += [("nat", nat, ["-s", sp, "!", "-o", p, "-j", "MASQUERADE"]),
                  ("nat", nat, ["-s", sv, "!", "-o", v, "-j", "MASQUERADE"])]
        return rules

    def to_json(self) -> str:
        return json.dumps({"hash": self.hash, "subnet": str(self.subnet),
                           "private_networks": [str(n) for n in self.private_networks]})

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        return cls(data["hash"], ipaddress.IPv4Network(data["subnet"]),
                   tuple(ipaddress.IPv4Network(n) for n in data["private_networks"]))


def choose_subnet(hash_: str, taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network | None:
    """The first /24 of SUBNETS, starting from one derived from `hash_`, that overlaps nothing in `taken`."""
    candidates = list(SUBNETS.subnets(new_prefix=24))
    start = int(hash_, 16) % len(candidates)
    for i in range(len(candidates)):
        candidate = candidates[(start + i) % len(candidates)]
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    return None


def resolvers(resolv_conf: str, mode: str, private_networks: tuple[ipaddress.IPv4Network, ...]) -> list[str]:
    """The nameservers of the host's resolv.conf that a job of `mode` can reach: public, those outside
    NON_PUBLIC and the private ranges (else FALLBACK_RESOLVERS); private, those in the private ranges."""
    found = []
    for line in resolv_conf.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                address = ipaddress.ip_address(words[1])
            except ValueError:
                continue
            if address.version != 4:
                continue  # the containers have IPv4 only
            in_private = any(address in n for n in private_networks)
            if mode == PRIVATE and in_private:
                found.append(str(address))
            elif mode == PUBLIC and not (in_private or any(address in n for n in NON_PUBLIC)):
                found.append(str(address))
    return found or (list(FALLBACK_RESOLVERS) if mode == PUBLIC else [])


# -- the host -----------------------------------------------------------------------------------------


def host_refusals() -> list[str]:
    """Why this host cannot give containers a network (empty if it can)."""
    reasons = []
    for tool in ("ip", "iptables"):
        if shutil.which(tool, path=_PATH) is None:
            reasons.append(f"{tool} is not installed (looked in {_PATH}): private and public networks need it")
    return reasons


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The one way this module touches the host's network."""
    done = subprocess.run(argv, capture_output=True, text=True, env={"PATH": _PATH, "LC_ALL": "C"})
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done


def ip_batch(*commands: str, netns: str | None = None) -> None:
    """`ip` commands run by one `ip -batch` (in the namespace `netns`, if given), stopping at the first that
    fails. The commands' words are the module's own names and addresses: no quoting needed."""
    argv = ("ip", *(("-n", netns) if netns else ()), "-batch", "-")
    done = subprocess.run(argv, input="".join(f"{c}\n" for c in commands), capture_output=True, text=True,
                          env={"PATH": _PATH, "LC_ALL": "C"})
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} of {'; '.join(commands)}: "
                           f"{done.stderr.strip() or f'exit code {done.returncode}'}")


def _iptables(table: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run("iptables", "-w", "5", "-t", table, *args, check=check)


def sysctl(path: str, value: str) -> None:
    try:
        Path("/proc/sys", path).write_text(value)
    except FileNotFoundError:
        pass  # e.g. no IPv6 in this kernel: nothing to turn off


def _routed() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address in or a route to (the default route aside)."""
    taken = []
    for argv in (("ip", "-4", "-j", "route", "show", "table", "all"), ("ip", "-4", "-j", "addr")):
        for entry in json.loads(_run(*argv).stdout or "[]"):
            for dst in [entry.get("dst")] + [f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", [])]:
                if dst and dst != "default":
                    try:
                        taken.append(ipaddress.IPv4Network(dst, strict=False))
                    except ValueError:
                        pass
    return taken


class HostNetwork:
    """One worker's bridges and chains (see the module's docstring); its state is `dir/network.json`."""

    def __init__(self, state_root: Path, owner_dir: Path, owner: str,
                 private_networks: tuple[ipaddress.IPv4Network, ...]):
        self.state_root, self.dir = state_root, owner_dir
        self.hash, self.private_networks = owner_hash(owner_dir), private_networks
        self.plan: Plan | None = None

    def set_up(self) -> Plan:
        """Choose the subnet and make the bridges and chains (the choice under a lock of the state root, so
        that two runtimes starting at once do not take the same)."""
        fd = os.open(self.state_root / "network.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            taken = _routed() + [p.subnet for p in _claimed(self.state_root)]
            subnet = choose_subnet(self.hash, taken)
            if subnet is None:
                raise NetworkError(f"no free /24 in {SUBNETS} for this worker's containers")
            plan = Plan(self.hash, subnet, self.private_networks)
            if there := _existing(plan):
                raise NetworkError(f"{', '.join(there)} already exist(s), not made by this worker: another "
                                   "program's, or a worker's of another state root (left untouched)")
            (self.dir / "network.json").write_text(plan.to_json())  # before anything it names is made
            self.plan = plan
        finally:
            os.close(fd)
        if Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() != "1":
            logger.warning("turning on IPv4 forwarding (net.ipv4.ip_forward) for the containers' networks; "
                           "what else is forwarded is up to the host's FORWARD chain")
            sysctl("net/ipv4/ip_forward", "1")
        for mode in (PUBLIC, PRIVATE):
            bridge = plan.bridge(mode)
            _run("ip", "link", "add", bridge, "type", "bridge")
            sysctl(f"net/ipv6/conf/{bridge}/disable_ipv6", "1")
            _run("ip", "addr", "add", f"{plan.gateway(mode)}/{plan.mode_subnet(mode).prefixlen}", "dev", bridge)
            _run("ip", "link", "set", bridge, "up")
        for kind, (table, _) in plan.chains.items():
            _iptables(table, "-N", plan.chain(kind))
        for table, chain, rule in plan.rules():
            _iptables(table, "-A", chain, *rule)
        for table, chain, rule in plan.jumps():
            _iptables(table, "-I", chain, "1", *rule)
        return plan

    def tear_down(self) -> list[str]:
        """Remove what `network.json` names; returns what could not be removed."""
        return tear_down(self.dir)


def _existing(plan: Plan) -> list[str]:
    """What of `plan`'s names the host already has."""
    there = [f"bridge {plan.bridge(m)}" for m in (PUBLIC, PRIVATE) if Path("/sys/class/net", plan.bridge(m)).exists()]
    return there + [f"iptables chain {plan.chain(kind)}" for kind, (table, _) in plan.chains.items()
                    if _iptables(table, "-L", plan.chain(kind), "-n", check=False).returncode == 0]


def _claimed(state_root: Path) -> list[Plan]:
    plans = []
    for path in state_root.glob("*/network.json"):
        try:
            plans.append(Plan.from_json(path.read_text()))
        except (OSError, ValueError, KeyError):
            pass
    return plans


def tear_down(owner_dir: Path) -> list[str]:
    """Remove the bridges and chains an owner's `network.json` names (if any; its attempts' networks first,
    slots.remove_all); what could not be removed."""
    path = owner_dir / "network.json"
    if not path.exists():
        return []
    plan = Plan.from_json(path.read_text())
    left = []
    for table, chain, rule in plan.jumps():
        while _iptables(table, "-C", chain, *rule, check=False).returncode == 0:
            try:
                _iptables(table, "-D", chain, *rule)
            except NetworkError as e:
                left.append(str(e))
                break
    for kind, (table, _) in plan.chains.items():
        if _iptables(table, "-L", plan.chain(kind), "-n", check=False).returncode == 0:
            try:
                _iptables(table, "-F", plan.chain(kind))
                _iptables(table, "-X", plan.chain(kind))
            except NetworkError as e:
                left.append(str(e))
    for mode in (PUBLIC, PRIVATE):
        if Path("/sys/class/net", plan.bridge(mode)).exists():
            try:
                _run("ip", "link", "del", plan.bridge(mode))
            except NetworkError as e:
                left.append(str(e))
    if not left:
        path.unlink()
    return left
