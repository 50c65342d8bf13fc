#!/usr/bin/env python3
"""Checks docker/Dockerfile against the rest of the repository, in well under a second and
without a container engine or network (the full image build is scripts/container.sh's):

- the build stage installs scripts/setup.sh's packages by running it: setup.sh is copied in
  and run, and no apt-get install of the Dockerfile names a package of setup.sh's list (the
  list lives in one place; NCCL is the one addition);
- the runtime stage installs the list docker/runtime_packages.sh writes in the build stage;
- every ARG has a use, an ARG named in a FROM is declared before the first FROM with a
  default, and every variable an instruction reads is an ARG or ENV of its own stage (an
  ARG declared before FROM or in another stage expands to nothing there; a misspelled one
  everywhere);
- every --build-arg that scripts/container.sh passes is an ARG of the Dockerfile;
- every file COPY takes from the context exists and is not excluded by
  docker/Dockerfile.dockerignore;
- the programs the image promises (the ones docker/ncf-check checks) are all built by
  src/CMakeLists.txt, copied into the runtime stage, and given to runtime_packages.sh; the
  runtime stage puts them and launch/ on PATH.

  python3 docker/check_dockerfile.py [ROOT]     # exit 1 and one line per finding
  python3 docker/check_dockerfile.py --self-test  # broken copies are caught
"""

import fnmatch
import os
import re
import shutil
import sys
import tempfile

# Variables every base image sets.
BASE_ENV = {"PATH", "HOME", "HOSTNAME"}
# ARGs consumed from the environment by the programs a RUN starts, not by name.
ENV_ARGS = {"DEBIAN_FRONTEND"}
# Packages the build stage may install besides setup.sh's: NCCL, from NVIDIA's repository.
EXTRA_BUILD_PACKAGES = {"libnccl2", "libnccl-dev"}
REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|([A-Za-z_][A-Za-z0-9_]*))")


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def instructions(text):
    """(line, KEYWORD, rest) for each instruction, continuations joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    return out


def setup_packages(text):
    """The names of setup.sh's packages=(...) array and its packages+=(...) lines."""
    names = set()
    m = re.search(r"^packages=\((.*?)^\)", text, re.S | re.M)
    if m:
        for line in m.group(1).splitlines():
            names.update(line.split("#", 1)[0].split())
    for m in re.finditer(r"packages\+=\(([^)]*)\)", text):
        names.update(m.group(1).split())
    return names


def installed_names(run):
    """Literal package names after each `apt-get install` of a RUN (options skipped)."""
    names = set()
    for m in re.finditer(r"apt-get\s+install\s+([^;&|]*)", run):
        for w in m.group(1).split():
            if not w.startswith("-") and "$" not in w:
                names.add(w)
    return names


def ignored(path, patterns):
    parts = path.strip("/").split("/")
    for p in patterns:
        p = p.rstrip("/")
        pp = p[3:] if p.startswith("**/") else p
        for i in range(len(parts)):
            if fnmatch.fnmatch("/".join(parts[: i + 1]), pp) or (
                p.startswith("**/") and fnmatch.fnmatch(parts[i], pp)
            ):
                return True
    return False


def check(root):
    findings = []
    df_rel = "docker/Dockerfile"
    df = read(root, df_rel)
    ins = instructions(df)
    setup = setup_packages(read(root, "scripts/setup.sh"))
    if len(setup) < 5:
        findings.append("scripts/setup.sh: found %d packages in packages=(...)" % len(setup))
    ignore = [
        l.strip()
        for l in read(root, "docker/Dockerfile.dockerignore").splitlines()
        if l.strip() and not l.startswith("#")
    ]

    # Stages: index -1 holds the global ARGs (before the first FROM).
    stages = []  # dicts: name, from, line, ins
    globals_ = {}  # ARG name -> default or None
    for line, kw, rest in ins:
        if kw == "FROM":
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append({"name": name, "from": words[0], "line": line, "ins": []})
        elif not stages:
            if kw != "ARG":
                findings.append("%s:%d: %s before the first FROM" % (df_rel, line, kw))
                continue
            n, eq, default = rest.partition("=")
            globals_[n] = default if eq else None
        else:
            stages[-1]["ins"].append((line, kw, rest))
    if len(stages) < 2:
        findings.append("%s: %d stage(s); a build stage and a runtime stage wanted" % (df_rel, len(stages)))
        return findings
    all_args = set(globals_)
    for st in stages:
        all_args.update(r.partition("=")[0] for _, kw, r in st["ins"] if kw == "ARG")

    # ARGs: FROM uses global ARGs with defaults; a stage reads only ARGs it declares.
    used_globals = set()
    for st in stages:
        for ref in (a or b for a, b in REF.findall(st["from"])):
            used_globals.add(ref)
            if ref not in globals_:
                findings.append("%s:%d: FROM reads ${%s}, which no ARG before the first FROM declares"
                                % (df_rel, st["line"], ref))
            elif not globals_[ref]:
                findings.append("%s:%d: ARG %s (read by FROM) has no default" % (df_rel, st["line"], ref))
        declared, used, env = {}, set(), set(BASE_ENV)
        for line, kw, rest in st["ins"]:
            if kw == "ARG":
                declared[rest.partition("=")[0]] = line
                continue
            # '...' is the shell's (dpkg-query -f='${Status}'), not the Dockerfile's.
            text = re.sub(r"'[^']*'", "''", rest) if kw == "RUN" else rest
            for ref in (a or b for a, b in REF.findall(text)):
                used.add(ref)
                if ref in declared or ref in env:
                    continue
                if ref in all_args:
                    findings.append("%s:%d: %s reads ${%s}, an ARG this stage does not declare "
                                    "(it expands to nothing here)" % (df_rel, line, kw, ref))
                elif not (kw == "RUN" and re.search(r"(\b%s=|\bfor %s in\b)" % (ref, ref), text)):
                    findings.append("%s:%d: %s reads ${%s}, which no ARG or ENV declares"
                                    % (df_rel, line, kw, ref))
            if kw == "ENV":
                env.update(re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", rest))
        for name, line in declared.items():
            if name not in used and name not in ENV_ARGS:
                findings.append("%s:%d: ARG %s is never used" % (df_rel, line, name))
    for name in globals_:
        if name not in used_globals:
            findings.append("%s: ARG %s (before the first FROM) is used by no FROM" % (df_rel, name))

    # container.sh's --build-arg names.
    for name in sorted(set(re.findall(r"--build-arg\s+\"?([A-Za-z_][A-Za-z0-9_]*)=", read(root, "scripts/container.sh")))):
        if name not in all_args:
            findings.append("scripts/container.sh: --build-arg %s is no ARG of %s" % (name, df_rel))

    build, runtime = stages[0], stages[-1]
    # Packages: setup.sh run in the build stage; its names nowhere else.
    copies_setup = any(kw == "COPY" and "scripts/setup.sh" in r.split()[0:1] for _, kw, r in build["ins"])
    runs_setup = any(kw == "RUN" and re.search(r"\bbash\s+\S*scripts/setup\.sh\b", r) for _, kw, r in build["ins"])
    if not (copies_setup and runs_setup):
        findings.append("%s: the build stage does not COPY and RUN scripts/setup.sh" % df_rel)
    for st in stages:
        for line, kw, rest in st["ins"]:
            if kw != "RUN":
                continue
            names = installed_names(rest)
            for n in sorted(names & setup):
                findings.append("%s:%d: apt-get install names %s, which scripts/setup.sh installs "
                                "(keep the list in one place)" % (df_rel, line, n))
            if st is build:
                for n in sorted(names - setup - EXTRA_BUILD_PACKAGES):
                    findings.append("%s:%d: the build stage installs %s, which scripts/setup.sh does "
                                    "not list" % (df_rel, line, n))
            elif names:
                findings.append("%s:%d: the runtime stage names packages (%s); it installs "
                                "runtime_packages.sh's list" % (df_rel, line, " ".join(sorted(names))))
    if not any(kw == "RUN" and "runtime-packages.txt" in r and "apt-get install" in r for _, kw, r in runtime["ins"]):
        findings.append("%s: the runtime stage does not install runtime-packages.txt" % df_rel)

    # COPY sources from the context exist and are not ignored.
    for st in stages:
        for line, kw, rest in st["ins"]:
            if kw not in ("COPY", "ADD"):
                continue
            words = [w for w in rest.split() if not w.startswith("--")]
            if "--from=" in rest:
                continue
            for src in words[:-1]:
                if src == ".":
                    continue
                if not os.path.exists(os.path.join(root, src)):
                    findings.append("%s:%d: COPY %s: no such file in the repository" % (df_rel, line, src))
                elif ignored(src, ignore):
                    findings.append("%s:%d: COPY %s: docker/Dockerfile.dockerignore excludes it" % (df_rel, line, src))

    # The programs promised: ncf-check's list, built, copied, and given to runtime_packages.sh.
    m = re.search(r"^for p in ((?:ncf_\w+ ?)+); do", read(root, "docker/ncf-check"), re.M)
    promised = m.group(1).split() if m else []
    if not promised:
        findings.append("docker/ncf-check: no `for p in ncf_... ; do` list of programs")
    cmake = read(root, "src/CMakeLists.txt")
    built = set(re.findall(r"^\s*add_executable\((\w+)", cmake, re.M))
    copied = set()
    for _, kw, rest in runtime["ins"]:
        if kw == "COPY" and "--from=" in rest:
            copied.update(re.findall(r"/build/src/(\w+)", rest))
    listed = set()
    for _, kw, rest in build["ins"]:
        if kw == "RUN" and "runtime_packages.sh" in rest:
            listed.update(re.findall(r"build/src/(\w+)", rest.split("runtime_packages.sh", 1)[1]))
    for p in promised:
        if p not in built:
            findings.append("src/CMakeLists.txt: no add_executable(%s ...), which the image promises" % p)
        if p not in copied:
            findings.append("%s: the runtime stage does not copy %s from the build stage" % (df_rel, p))
        if p not in listed:
            findings.append("%s: runtime_packages.sh is not given build/src/%s" % (df_rel, p))
    for p in sorted(copied - set(promised)):
        findings.append("%s: the runtime stage copies %s, which docker/ncf-check does not check" % (df_rel, p))
    env = " ".join(r for _, kw, r in runtime["ins"] if kw == "ENV")
    path = re.search(r"PATH=(\S+)", env)
    for d in ("/opt/ncf_dist/bin", "/opt/ncf_dist/launch"):
        if not path or d not in path.group(1).split(":"):
            findings.append("%s: the runtime stage's PATH lacks %s" % (df_rel, d))
    for src, dst in (("/opt/ncf_dist/launch", "/opt/ncf_dist/launch"), ("docker/ncf-check", "/opt/ncf_dist/bin/ncf-check")):
        if not any(kw == "COPY" and src in r and r.split()[-1] == dst for _, kw, r in runtime["ins"]):
            findings.append("%s: the runtime stage does not COPY %s to %s" % (df_rel, src, dst))
    return findings


# ---- self-test: each breakage of a copy is reported --------------------------------------
FILES = ["docker/Dockerfile", "docker/Dockerfile.dockerignore", "docker/ncf-check",
         "docker/runtime_packages.sh", "scripts/setup.sh", "scripts/container.sh", "src/CMakeLists.txt"]


def edit(root, rel, old, new):
    text = read(root, rel)
    if old not in text:
        raise SystemExit("self-test: %r is not in %s; update the self-test" % (old, rel))
    with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))


BREAKAGES = [
    # (what, [(file, old text, new text), ...], a phrase the finding holds)
    ("a setup.sh package in the Dockerfile",
     [("docker/Dockerfile", "--no-install-recommends libnccl2", "--no-install-recommends libopenblas-dev libnccl2")],
     "names libopenblas-dev"),
    ("a package setup.sh lacks",
     [("docker/Dockerfile", "--no-install-recommends libnccl2", "--no-install-recommends libfoo-dev libnccl2")],
     "installs libfoo-dev"),
    ("setup.sh not run",
     [("docker/Dockerfile", "RUN bash /opt/ncf_dist/scripts/setup.sh", "RUN true")],
     "does not COPY and RUN scripts/setup.sh"),
    ("an ARG declared before FROM and read in a stage",
     [("docker/Dockerfile", 'ARG CUDA_ARCHS="80;90"\nRUN', "RUN"),
      ("docker/Dockerfile", "\nFROM ", '\nARG CUDA_ARCHS="80;90"\nFROM ')],
     "an ARG this stage does not declare"),
    ("a misspelled ARG",
     [("docker/Dockerfile", '"${RUN_TESTS}" = 1', '"${RUN_TEST}" = 1')],
     "reads ${RUN_TEST}, which no ARG or ENV declares"),
    ("an unused ARG",
     [("docker/Dockerfile", "ARG RUN_TESTS=1\n", "ARG RUN_TESTS=1\nARG UNUSED_ARG=1\n")],
     "ARG UNUSED_ARG is never used"),
    ("a FROM ARG without default",
     [("docker/Dockerfile", "ARG RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04", "ARG RUNTIME_IMAGE")],
     "has no default"),
    ("a misspelled --build-arg",
     [("scripts/container.sh", '--build-arg "CUDA_ARCHS=', '--build-arg "CUDA_ARCH=')],
     "--build-arg CUDA_ARCH is no ARG"),
    ("a promised program not built",
     [("src/CMakeLists.txt", "add_executable(ncf_export ", "add_executable(ncf_exporter ")],
     "no add_executable(ncf_export"),
    ("a promised program not copied",
     [("docker/Dockerfile", " /opt/ncf_dist/build/src/ncf_recommend", "")],
     "does not copy ncf_recommend"),
    ("a COPY of an ignored path",
     [("docker/Dockerfile.dockerignore", "data/\n", "data/\ndocker/ncf-check\n")],
     "excludes it"),
    ("launch/ off PATH",
     [("docker/Dockerfile", "PATH=/opt/ncf_dist/bin:/opt/ncf_dist/launch:", "PATH=/opt/ncf_dist/bin:")],
     "PATH lacks /opt/ncf_dist/launch"),
]


def self_test(root):
    ok = True
    caught = 0
    with tempfile.TemporaryDirectory() as tmp:
        def fresh():
            dst = os.path.join(tmp, "repo")
            shutil.rmtree(dst, ignore_errors=True)
            for rel in FILES:
                os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
                shutil.copy(os.path.join(root, rel), os.path.join(dst, rel))
            return dst

        clean = check(fresh())
        if clean:
            print("self-test: the unbroken copy has findings:\n  " + "\n  ".join(clean))
            ok = False
        for what, edits, phrase in BREAKAGES:
            copy = fresh()
            for rel, old, new in edits:
                edit(copy, rel, old, new)
            got = check(copy)
            if any(phrase in f for f in got):
                caught += 1
                print("self-test: caught %s" % what)
            else:
                print("self-test: NOT caught: %s (findings: %s)" % (what, got))
                ok = False
    print("self-test: %d of %d breakages caught" % (caught, len(BREAKAGES)))
    return 0 if ok else 1


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    if argv[1:2] == ["--self-test"]:
        return self_test(os.path.dirname(here))
    if len(argv) > 2 or argv[1:2] and argv[1].startswith("-"):
        print("usage: check_dockerfile.py [ROOT] | --self-test", file=sys.stderr)
        return 2
    root = argv[1] if len(argv) > 1 else os.path.dirname(here)
    if not os.path.isfile(os.path.join(root, "docker/Dockerfile")):
        print("check_dockerfile: ROOT '%s' has no docker/Dockerfile" % root, file=sys.stderr)
        return 2
    findings = check(root)
    for f in findings:
        print("check_dockerfile: " + f)
    if findings:
        return 1
    print("check_dockerfile: docker/Dockerfile agrees with setup.sh, CMake, ncf-check and container.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
