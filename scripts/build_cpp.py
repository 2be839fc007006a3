"""`make cpp`: the C++ example (examples/cpp) built against ONNX Runtime with nothing installed into the system;
prints the binary's path.

Its libraries come from Debian, with `apt-get download` in private apt directories under build/ (from the mirror
this machine's own apt sources name), then `dpkg-deb -x`: ONNX Runtime's C/C++ headers from `libonnxruntime-dev`
(trixie, the first release that packages it; headers only are used), and from this machine's own release
nlohmann-json (`nlohmann-json3-dev`), OpenSSL (`libssl-dev` with its `libssl3`, whose libcrypto does SHA-256),
SentencePiece (`libsentencepiece-dev`, `libsentencepiece0`) and ICU (`libicu-dev`, `libicu72`); the binary loads
their libraries from there. The ONNX Runtime library is the onnxruntime wheel's of the Python
running this script, copied beside the headers, so the binary runs the ONNX Runtime tfm-run runs (its C API is
versioned: older headers work with a newer library). Everything is cached in build/: a second run only rebuilds
what changed. Where the packages cannot be fetched (no apt, no network) it exits 3 with one line saying why.

    python scripts/build_cpp.py [--build-dir build]
"""

from __future__ import annotations

import argparse
import fcntl
import getpass
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "examples" / "cpp"
HEADERS_SUITE = "trixie"  # the first Debian release that packages ONNX Runtime (1.21)
HEADERS_PACKAGE = "libonnxruntime-dev"
# from this machine's own release (its libc and compiler are the ones these were built for)
LIBRARY_PACKAGES = ("nlohmann-json3-dev", "libssl-dev", "libssl3", "libsentencepiece-dev", "libsentencepiece0",
                    "libicu-dev", "libicu72")
PACKAGES_LISTED = "packages"  # in an unpacked directory: the packages it holds
UNAVAILABLE = 3  # exit status: the packages cannot be fetched here (the tests skip, saying why)
APT_SOURCES = Path("/etc/apt")
APT_TIMEOUT_S = 300
CXX_FLAGS = "-O2 -DNDEBUG"
JOBS = "2"


class Unavailable(Exception):
    """Debian's packages cannot be fetched on this machine."""


def codename() -> str:
    """This machine's Debian release name (VERSION_CODENAME in os-release)."""
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        raise Unavailable("no /etc/os-release: not a Debian system") from None
    found = re.search(r"^VERSION_CODENAME=\"?([\w-]+)\"?$", text, re.MULTILINE)
    if not found:
        raise Unavailable("/etc/os-release names no VERSION_CODENAME: not a Debian system")
    return found.group(1)


def mirror_sources(release: str, suite: str, apt_dir: Path = APT_SOURCES) -> str:
    """The machine's own apt entries for its release's main suite, with the suite changed to `suite` (deb822)."""
    stanzas = []
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            fields = dict(re.findall(r"^([\w-]+):\s*(.*)$", block, re.MULTILINE))
            if "deb" in fields.get("Types", "").split() and release in fields.get("Suites", "").split() \
                    and fields.get("Enabled", "yes") != "no":
                stanzas.append({"Types": "deb", "URIs": fields["URIs"], "Suites": suite,
                                "Components": "main", **({"Signed-By": fields["Signed-By"]}
                                                         if "Signed-By" in fields else {})})
    one_line = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in (p for p in one_line if p.is_file()):
        for line in path.read_text(encoding="utf-8").splitlines():
            found = re.match(r"^deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)\s", line)
            if found and found.group(3) == release:
                options = dict(re.findall(r"([\w-]+)=([^\s\]]+)", found.group(1) or ""))
                stanzas.append({"Types": "deb", "URIs": found.group(2), "Suites": suite,
                                "Components": "main", **({"Signed-By": options["signed-by"]}
                                                         if "signed-by" in options else {})})
    if not stanzas:
        raise Unavailable(f"no apt source for Debian {release} to take the mirror from")
    return "\n".join("".join(f"{key}: {value}\n" for key, value in s.items()) for s in stanzas)


def apt(apt_dir: Path, *args: str) -> None:
    """apt-get on the private directory only: its own sources, lists, cache and (empty) package status."""
    options = {"Dir::Etc::SourceList": "/dev/null", "Dir::Etc::SourceParts": apt_dir / "sources.list.d",
               "Dir::Etc::PreferencesParts": apt_dir / "preferences.d", "Dir::State": apt_dir / "state",
               "Dir::State::Lists": apt_dir / "lists", "Dir::State::status": apt_dir / "status",
               "Dir::Cache": apt_dir / "cache", "Debug::NoLocking": "1",
               "APT::Sandbox::User": getpass.getuser()}  # the private files are this user's
    command = ["apt-get", "-q", *[f"-o{key}={value}" for key, value in options.items()], *args]
    try:
        done = subprocess.run(command, cwd=apt_dir, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"apt-get {args[0]} took over {APT_TIMEOUT_S} s (no network?)") from None
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.startswith(("E:", "W:"))] or [done.stderr]
        raise Unavailable(f"apt-get {args[0]} failed: {lines[0].strip()}")


def fetch_packages(root: Path, suite: str, packages: tuple[str, ...]) -> Path:
    """The packages of `suite` unpacked into root/deb (whole or absent: an interrupted fetch is fetched again; a
    list of packages that changed is fetched anew)."""
    unpacked = root / "deb"
    listed = unpacked / PACKAGES_LISTED
    if listed.is_file() and listed.read_text() == " ".join(packages):
        return unpacked
    for tool in ("apt-get", "dpkg-deb"):
        if not shutil.which(tool):
            raise Unavailable(f"{tool} not found: the C++ example's libraries come from Debian's packages")
    apt_dir = root / "apt"
    shutil.rmtree(apt_dir, ignore_errors=True)
    for sub in ("sources.list.d", "preferences.d", "state", "lists/partial", "cache/archives/partial"):
        (apt_dir / sub).mkdir(parents=True)
    (apt_dir / "status").touch()
    (apt_dir / "sources.list.d" / f"{suite}.sources").write_text(mirror_sources(codename(), suite))
    apt(apt_dir, "update")
    apt(apt_dir, "download", *packages)
    partial = root / "deb.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for package in packages:
        subprocess.run(["dpkg-deb", "-x", str(next(apt_dir.glob(f"{package}_*.deb"))), str(partial)], check=True)
    (partial / PACKAGES_LISTED).write_text(" ".join(packages))
    shutil.rmtree(unpacked, ignore_errors=True)
    partial.rename(unpacked)
    return unpacked


def fetch_headers(ort_dir: Path) -> Path:
    """ONNX Runtime's headers in ort_dir/include, fetched once."""
    include = ort_dir / "include"
    if (include / "onnxruntime_cxx_api.h").is_file():
        return include
    unpacked = fetch_packages(ort_dir, HEADERS_SUITE, (HEADERS_PACKAGE,))
    partial = ort_dir / "include.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(unpacked / "usr" / "include" / "onnxruntime", partial)
    partial.rename(include)  # whole or absent: an interrupted fetch is fetched again
    return include


def copy_library(ort_dir: Path) -> Path:
    """The onnxruntime wheel's library in ort_dir/lib, with the libonnxruntime.so.1 and .so links a linker and
    the loader look for."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{sys.executable} has no onnxruntime; run `make setup` first")
    wheel = sorted(Path(spec.submodule_search_locations[0], "capi").glob("libonnxruntime.so.1.*"))
    if not wheel:
        raise SystemExit("the onnxruntime wheel holds no libonnxruntime.so.1.*")
    lib = ort_dir / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    copy = lib / wheel[-1].name
    if not copy.is_file() or copy.stat().st_size != wheel[-1].stat().st_size:
        for old in lib.glob("libonnxruntime.so*"):
            old.unlink()
        shutil.copy2(wheel[-1], copy)
    for name, target in (("libonnxruntime.so.1", copy.name), ("libonnxruntime.so", "libonnxruntime.so.1")):
        link = lib / name
        if not link.is_symlink():
            link.symlink_to(target)
    return lib


def build(build_dir: Path, ort_dir: Path, libraries: Path) -> Path:
    """Configure, then build what changed (the compiler's output only when it fails), and put the binary in bin/
    by a rename: a test or benchmark running it meanwhile never meets a half-linked file."""
    cpp = build_dir / "cpp"
    steps = [["cmake", "-S", str(SOURCE), "-B", str(cpp), "-DCMAKE_BUILD_TYPE=Release",
              f"-DCMAKE_CXX_FLAGS_RELEASE={CXX_FLAGS}", f"-DONNXRUNTIME_ROOT={ort_dir}",
              f"-DLIBRARIES_ROOT={libraries}"],
             ["cmake", "--build", str(cpp), "-j", JOBS]]
    for step in steps:  # configuring again is quick, and takes new settings into a cached build
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(step[:2])} failed:\n{done.stdout}{done.stderr}")
    built, binary = cpp / "tfm_translate", cpp / "bin" / "tfm_translate"
    if not binary.is_file() or binary.stat().st_mtime < built.stat().st_mtime:
        binary.parent.mkdir(exist_ok=True)
        shutil.copy2(built, binary.with_suffix(".partial"))
        binary.with_suffix(".partial").replace(binary)
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=Path, default=REPO / "build")
    args = parser.parse_args()
    build_dir = args.build_dir.resolve()
    ort_dir = build_dir / "onnxruntime"
    ort_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "cpp.lock", "w") as lock:  # one build at a time (test workers, make)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            fetch_headers(ort_dir)
            libraries = fetch_packages(build_dir / "cpp-libraries", codename(), LIBRARY_PACKAGES)
        except Unavailable as exc:
            print(f"the C++ example's Debian packages are unavailable here: {exc}", file=sys.stderr)
            raise SystemExit(UNAVAILABLE) from None
        copy_library(ort_dir)
        print(build(build_dir, ort_dir, libraries / "usr"))


if __name__ == "__main__":
    main()
