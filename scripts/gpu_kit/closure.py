"""The dependency closure of `gpu_kit.sh pack` (scripts/gpu_kit/pack.sh, closure).

closure.py ROOTS BASE_ROOTS SKIP [STATUS [AVAIL]]: each a space-separated list of package
names; prints "name version" of the packages ROOTS need (Depends and Pre-Depends, first
alternative), minus the baseline: the installed packages of Priority required / Essential,
BASE_ROOTS, and everything they depend on. STATUS is dpkg's status file
(/var/lib/dpkg/status), AVAIL a file in `apt-cache dumpavail`'s format (default: that
command's output); the tests give both.
"""
import re, subprocess, sys
roots, base_roots, skip = sys.argv[1].split(), sys.argv[2].split(), set(sys.argv[3].split())
def paras(text):
    for p in text.split("\n\n"):
        m = re.search(r"^Package: (\S+)", p, re.M)
        if m:
            yield m.group(1), p
def field(p, name):
    m = re.search(rf"^{name}: (.*(?:\n .*)*)", p, re.M)
    return m.group(1).replace("\n", " ") if m else ""
def bare(d):  # "libfoo:any (>= 1)" -> "libfoo"
    return re.sub(r"\(.*?\)", "", d).strip().split(":")[0]
def groups(p):
    for g in (field(p, "Pre-Depends") + "," + field(p, "Depends")).split(","):
        alts = [bare(a) for a in g.split("|") if bare(a)]
        if alts:
            yield alts
def provides(pk):
    prov = {}
    for n, p in pk.items():
        prov.setdefault(n, []).insert(0, n)
        for d in field(p, "Provides").split(","):
            if bare(d):
                prov.setdefault(bare(d), []).append(n)
    return prov
status = sys.argv[4] if len(sys.argv) > 4 else "/var/lib/dpkg/status"
inst = {n: p for n, p in paras(open(status, encoding="utf-8").read())
        if re.search(r"^Status: .* installed$", p, re.M)}
iprov = provides(inst)
todo = [n for n, p in inst.items() if re.search(r"^(Priority: required|Essential: yes)$", p, re.M)]
todo += [r for r in base_roots if r in inst]
base = set()
while todo:
    n = todo.pop()
    if n in base:
        continue
    base.add(n)
    for alts in groups(inst[n]):
        for a in alts:
            if a in iprov:
                todo.append(iprov[a][0])
                break
for must in ("libc6", "libstdc++6", "libgcc-s1", "g++", "gcc"):
    if must not in base:
        sys.exit(f"closure: the baseline lacks {must}: install build-essential here first")
in_base = set()
for n in base:
    in_base.add(n)
    in_base.update(bare(d) for d in field(inst[n], "Provides").split(",") if bare(d))
if len(sys.argv) > 5:
    avail = dict(paras(open(sys.argv[5], encoding="utf-8").read()))
else:
    avail = dict(paras(subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True,
                                      check=True).stdout))
aprov = provides(avail)
kit, todo = set(), list(roots)
while todo:
    n = todo.pop()
    if n in kit:
        continue
    if n not in avail:
        sys.exit(f"closure: package {n} is not available (apt-get update first?)")
    kit.add(n)
    for alts in groups(avail[n]):
        if any(a in in_base or a in skip or a in kit for a in alts):
            continue
        pick = next((aprov[a][0] for a in alts if a in aprov), None)
        if pick is None:
            sys.exit(f"closure: {n} depends on {' | '.join(alts)}, none available")
        todo.append(pick)
for n in sorted(kit):
    print(n, re.search(r"^Version: (\S+)", avail[n], re.M).group(1))
