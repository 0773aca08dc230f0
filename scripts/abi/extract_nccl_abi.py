#!/usr/bin/env python3
"""Extract NCCL's profiler plugin ABI (v4..v7) from the DWARF debug info of a real libnccl.so.2.

NCCL's PyPI wheels (nvidia-nccl-cu12 / nvidia-nccl-cu13) ship libnccl.so.2 with full DWARF. Each release keeps
adapters for every older profiler ABI version, so one binary holds the declarations of all of them; the release
in which a version is the *newest* one (its "home" release) additionally tells which event types and states
that version knows (later releases only have the grown, shared enums).

What is read, per version N (from the compile unit of NCCL's `getNcclProfiler_vN`, found through .symtab and
.debug_aranges so that only a handful of the ~200 compile units are ever parsed):
  Profiler    = ncclProfiler_vN_t              size, member offsets, function signatures
  EventDescr  = ncclProfilerEventDescr_vN_t     size, header members, the anonymous union's variants
  StateArgs   = ncclProfilerEventStateArgs_vN_t size, variants
  EventType   = the anonymous enum holding ncclProfileGroup...   (home release only)
  State       = ncclProfilerEventState_vN_t's enum               (home release only)
plus ncclResult_t, ncclDebugLogLevel, ncclDebugLogSubSys and ncclDebugLogger_t.

Output shape (also what tests/abi/layout_dump.cc prints for our header): a member is
{"name", "offset", "size", "kind"} where kind is one of u8/u16/u32/u64, i8/.../i64, bool, ptr, fnptr, enum32,
and fnptr members carry "sig": [return kind, parameter kinds...] (+ "variadic"). Enumerator names are
canonical: NCCL's prefix (ncclProfile / ncclProfiler / nccl / NCCL_LOG_ / NCCL_) and any "_v4" suffix dropped.

The committed fixture was made with (about 25 s once the six wheels are cached; ~2.3 GB of wheels):
  scripts/abi/extract_nccl_abi.py --release nvidia-nccl-cu12==2.30.7 --release nvidia-nccl-cu12==2.31.2

Usage:
  extract_nccl_abi.py                       # ensure default wheels in the cache, write tests/abi/nccl_abi_fixture.json
  extract_nccl_abi.py --wheel W.whl ...     # use given wheels
  extract_nccl_abi.py --lib libnccl.so.2    # one unpacked library
  extract_nccl_abi.py --out -               # print instead of writing
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# (pip package, version). The first is the reference binary (newest; holds v4..v7 side by side); the others are
# the home releases of v4 (2.27), v5 (2.28) and v6 (2.29). 2.30.x / 2.31.x can be added with --release.
DEFAULT_RELEASES = [
    ("nvidia-nccl-cu13", "2.32.3"),
    ("nvidia-nccl-cu12", "2.27.7"),
    ("nvidia-nccl-cu12", "2.28.9"),
    ("nvidia-nccl-cu12", "2.29.7"),
]
VERSIONS = (4, 5, 6, 7)
LIB_IN_WHEEL = "nvidia/nccl/lib/libnccl.so.2"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FIXTURE = REPO_ROOT / "tests" / "abi" / "nccl_abi_fixture.json"


class AbiExtractError(RuntimeError):
    """Raised with a message meant for a human: what failed and what to do."""


# ----------------------------------------------------------------------------------------------------------
# Wheels
# ----------------------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mycroft-otel" / "wheels"


def wheel_glob(package: str, version: str) -> str:
    return f"{package.replace('-', '_')}-{version}-*x86_64*.whl"


def ensure_wheel(package: str, version: str, cache: Path | None = None) -> Path:
    """Return the cached wheel, downloading it with pip (no deps) when missing."""
    cache = cache or cache_dir()
    found = sorted(cache.glob(wheel_glob(package, version)))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    # Ask for the x86-64 wheel whatever the host is (our static_asserts and fixture are x86-64). pip does not
    # widen a --platform to older manylinux tags by itself, so list the ones NCCL wheels use.
    plats = ["manylinux2014_x86_64"] + [f"manylinux_2_{m}_x86_64" for m in (17, 18, 27, 28)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           *[a for p in plats for a in ("--platform", p)], f"{package}=={version}", "-d", str(cache)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(wheel_glob(package, version)))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise AbiExtractError(
            f"could not download {package}=={version} into {cache} (network needed once; or place the wheel "
            f"there by hand). pip said: {' | '.join(tail)}")
    return found[0]


def version_of_wheel(wheel: Path) -> tuple[str, str]:
    m = re.match(r"(nvidia_nccl_cu\d+)-([0-9.]+(?:\.post\d+)?)-", wheel.name)
    if not m:
        raise AbiExtractError(f"{wheel.name}: not an nvidia-nccl wheel name")
    return m.group(1).replace("_", "-"), m.group(2)


def unpack_lib(wheel: Path, into: Path) -> Path:
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise AbiExtractError(f"{wheel}: corrupt wheel (interrupted download?); delete it and rerun") from None
    with zf:
        try:
            info = zf.getinfo(LIB_IN_WHEEL)
        except KeyError:
            raise AbiExtractError(f"{wheel.name}: no {LIB_IN_WHEEL} inside") from None
        out = into / f"{wheel.stem}.libnccl.so.2"
        with zf.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
    return out


# ----------------------------------------------------------------------------------------------------------
# DWARF
# ----------------------------------------------------------------------------------------------------------
def _name(die):
    a = die.attributes.get("DW_AT_name")
    return a.value.decode() if a else None


def _target(die):
    return die.get_DIE_from_attribute("DW_AT_type") if "DW_AT_type" in die.attributes else None


def _strip(die):
    """Follow typedef / const / volatile to the underlying type (None for void)."""
    while die is not None and die.tag in ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type"):
        die = _target(die)
    return die


def _size(die):
    die = _strip(die)
    if die is None:
        return 0
    if die.tag == "DW_TAG_pointer_type":
        return die.attributes["DW_AT_byte_size"].value if "DW_AT_byte_size" in die.attributes else 8
    return die.attributes["DW_AT_byte_size"].value


def _kind(die) -> str:
    die = _strip(die)
    if die is None:
        return "void"
    tag = die.tag
    if tag == "DW_TAG_pointer_type":
        pointee = _strip(_target(die))
        return "fnptr" if pointee is not None and pointee.tag == "DW_TAG_subroutine_type" else "ptr"
    if tag == "DW_TAG_enumeration_type":
        return f"enum{8 * _size(die)}"
    if tag == "DW_TAG_base_type":
        enc = die.attributes["DW_AT_encoding"].value
        bits = 8 * die.attributes["DW_AT_byte_size"].value
        if enc == 0x02:  # DW_ATE_boolean
            return "bool"
        if enc in (0x05, 0x06):  # signed, signed_char
            return f"i{bits}"
        if enc in (0x07, 0x08, 0x10):  # unsigned, unsigned_char, UTF
            return f"u{bits}"
        return f"base{enc}_{bits}"
    if tag in ("DW_TAG_structure_type", "DW_TAG_union_type"):
        return "struct" if tag == "DW_TAG_structure_type" else "union"
    return tag


def _signature(die) -> dict:
    """Signature of a function pointer type: return kind + parameter kinds (+ variadic)."""
    sub = _strip(_target(_strip(die)))
    params, variadic = [], False
    for c in sub.iter_children():
        if c.tag == "DW_TAG_formal_parameter":
            params.append(_kind(_target(c)))
        elif c.tag == "DW_TAG_unspecified_parameters":
            variadic = True
    sig = {"sig": [_kind(_target(sub))] + params}
    if variadic:
        sig["variadic"] = True
    return sig


def _member(die) -> dict:
    loc = die.attributes.get("DW_AT_data_member_location")
    t = _target(die)
    m = {"name": _name(die) or "", "offset": loc.value if loc else 0, "size": _size(t), "kind": _kind(t)}
    if m["kind"] == "fnptr":
        m.update(_signature(t))
    return m


def _record(die) -> dict:
    """A struct or union with scalar members (nested unnamed aggregates are handled by the caller)."""
    die = _strip(die)
    members = [_member(c) for c in die.iter_children() if c.tag == "DW_TAG_member"]
    return {"size": die.attributes["DW_AT_byte_size"].value, "members": members}


def _union_of_records(die) -> dict:
    """A union whose members are (named) structs: {size, variants: {name: record}}."""
    die = _strip(die)
    variants = {}
    for c in die.iter_children():
        if c.tag == "DW_TAG_member":
            variants[_name(c)] = _record(_target(c))
    return {"size": die.attributes["DW_AT_byte_size"].value, "variants": variants}


def _event_descr(die) -> dict:
    die = _strip(die)
    header, union = [], None
    for c in die.iter_children():
        if c.tag != "DW_TAG_member":
            continue
        t = _strip(_target(c))
        if _name(c) is None and t.tag == "DW_TAG_union_type":
            union = _union_of_records(t)
            union["offset"] = c.attributes["DW_AT_data_member_location"].value
        else:
            header.append(_member(c))
    return {"size": die.attributes["DW_AT_byte_size"].value, "members": header, "union": union}


def _canon(name: str) -> str:
    for prefix in ("ncclProfiler", "ncclProfile", "NCCL_LOG_", "NCCL_", "nccl"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return re.sub(r"_v\d+$", "", name)


def _enum_values(die) -> dict:
    die = _strip(die)
    return {_canon(_name(c)): c.attributes["DW_AT_const_value"].value
            for c in die.iter_children() if c.tag == "DW_TAG_enumerator"}


def _enum_with(top, enumerator: str):
    for die in top.iter_children():
        if die.tag == "DW_TAG_enumeration_type":
            for c in die.iter_children():
                if _name(c) == enumerator:
                    return die
    return None


def _typedefs(top) -> dict:
    return {_name(d): d for d in top.iter_children() if d.tag == "DW_TAG_typedef" and _name(d)}


def _cu_of_function(elf, dwarf, aranges, symtab, fragment: str):
    """Top DIE of the compile unit defining the first function symbol whose name contains `fragment`."""
    for sym in symtab.iter_symbols():
        if fragment in sym.name and sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"]:
            return dwarf.get_CU_at(aranges.cu_offset_at_addr(sym["st_value"])).get_top_DIE()
    raise AbiExtractError(f"no function symbol containing {fragment!r}")


def extract_lib(lib: Path) -> dict:
    """Extract every profiler version present in one libnccl.so.2."""
    from elftools.elf.elffile import ELFFile  # pip: pyelftools

    with open(lib, "rb") as fh:
        elf = ELFFile(fh)
        if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
            raise AbiExtractError(f"{lib}: no DWARF (.debug_info) in this build")
        symtab = elf.get_section_by_name(".symtab")
        if symtab is None:
            raise AbiExtractError(f"{lib}: no .symtab, cannot locate the profiler adapters")
        dwarf = elf.get_dwarf_info()
        aranges = dwarf.get_aranges()
        out: dict = {"versions": {}}
        newest = None
        common_top = None  # profiler.cc: always has the event-type and state enums

        def enum_from(top, enumerator):
            nonlocal common_top
            die = _enum_with(top, enumerator)
            if die is None:
                if common_top is None:
                    common_top = _cu_of_function(elf, dwarf, aranges, symtab, "ncclProfilerPluginInit")
                die = _enum_with(common_top, enumerator)
            if die is None:
                raise AbiExtractError(f"{lib}: no enum holding {enumerator}")
            return _enum_values(die)

        for n in VERSIONS:
            syms = symtab.get_symbol_by_name(f"_Z18getNcclProfiler_v{n}Pv")
            if not syms:
                continue
            cu = dwarf.get_CU_at(aranges.cu_offset_at_addr(syms[0]["st_value"]))
            top = cu.get_top_DIE()
            tds = _typedefs(top)
            need = {"Profiler": f"ncclProfiler_v{n}_t", "EventDescr": f"ncclProfilerEventDescr_v{n}_t",
                    "StateArgs": f"ncclProfilerEventStateArgs_v{n}_t"}
            missing = [t for t in need.values() if t not in tds]
            if missing:
                raise AbiExtractError(f"{lib}: compile unit {_name(top)} lacks {missing}")
            ver = {
                "cu": _name(top),
                "Profiler": _record(tds[need["Profiler"]]),
                "EventDescr": _event_descr(tds[need["EventDescr"]]),
                "StateArgs": _union_of_records(tds[need["StateArgs"]]),
                "EventType": enum_from(top, "ncclProfileGroup"),
                "State": enum_from(top, "ncclProfilerProxyStepSendGPUWait"),
            }
            out["versions"][f"v{n}"] = ver
            newest = (n, top, tds)
        if newest is None:
            raise AbiExtractError(f"{lib}: no getNcclProfiler_v4..v7 symbol; not a profiler-capable NCCL")
        n, top, tds = newest
        out["newest"] = f"v{n}"
        logger = tds.get("ncclDebugLogger_t")
        out["shared"] = {
            "Result": {k: v for k, v in _enum_values(tds["ncclResult_t"]).items() if k != "NumResults"},
            "LogLevel": _enum_values(tds["ncclDebugLogLevel"]),
            "LogSubsys": _enum_values(tds["ncclDebugLogSubSys"]),
            "DebugLogger": _signature(logger) if logger is not None else None,
        }
    return out


# ----------------------------------------------------------------------------------------------------------
# Fixture
# ----------------------------------------------------------------------------------------------------------
LAYOUT_KEYS = ("Profiler", "EventDescr", "StateArgs")


def build_fixture(per_release: dict[str, dict]) -> dict:
    """Combine releases: layout of vN from every release holding it (must agree), enums from vN's home release.

    per_release maps "package==version" -> extract_lib() output. The first entry is the reference binary.
    """
    ref_key = next(iter(per_release))
    ref = per_release[ref_key]
    fixture = {
        "generator": "scripts/abi/extract_nccl_abi.py",
        "arch": "x86_64",
        "reference": ref_key,
        "releases": {k: v["newest"] for k, v in per_release.items()},
        "shared": ref["shared"],
        "versions": {},
        "disagreements": [],
    }
    for vname in (f"v{n}" for n in VERSIONS):
        holders = [(k, r["versions"][vname]) for k, r in per_release.items() if vname in r["versions"]]
        if not holders:
            continue
        base_key, base = next(((k, v) for k, v in holders if k == ref_key), holders[0])
        entry = {k: base[k] for k in LAYOUT_KEYS}
        entry["layout_from"] = [k for k, v in holders if all(v[x] == base[x] for x in LAYOUT_KEYS)]
        for k, v in holders:
            if k not in entry["layout_from"]:
                fixture["disagreements"].append(f"{vname} layout in {k} differs from {base_key}")
        homes = [k for k, r in per_release.items() if r["newest"] == vname]
        enum_src = homes[0] if homes else base_key
        entry["enums_from"] = enum_src
        entry["EventType"] = per_release[enum_src]["versions"][vname]["EventType"]
        entry["State"] = per_release[enum_src]["versions"][vname]["State"]
        for k in homes[1:]:
            for e in ("EventType", "State"):
                if per_release[k]["versions"][vname][e] != entry[e]:
                    fixture["disagreements"].append(f"{vname} {e} in {k} differs from {enum_src}")
        fixture["versions"][vname] = entry
    return fixture


def _extract_one_wheel(wheel: Path) -> tuple[str, dict, str]:
    pkg, ver = version_of_wheel(wheel)
    with tempfile.TemporaryDirectory(prefix="mycroft-abi-") as tmp:
        t0 = time.monotonic()
        lib = unpack_lib(wheel, Path(tmp))
        t1 = time.monotonic()
        result = extract_lib(lib)
    note = f"{pkg}=={ver}: unpack {t1 - t0:.1f}s, DWARF {time.monotonic() - t1:.1f}s, newest {result['newest']}"
    return f"{pkg}=={ver}", result, note


def extract_wheels(wheels: list[Path], log=print) -> dict:
    """Extract every wheel (in parallel: unpacking ~400 MB dominates) and combine them, first = reference."""
    from concurrent.futures import ProcessPoolExecutor

    workers = max(1, min(len(wheels), os.cpu_count() or 1, 4))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(_extract_one_wheel, wheels))  # keeps the input order
    per_release = {}
    for key, result, note in done:
        per_release[key] = result
        log(note)
    return build_fixture(per_release)


def parse_release(s: str) -> tuple[str, str]:
    pkg, _, ver = s.partition("==")
    if not ver:
        raise argparse.ArgumentTypeError("expected PACKAGE==VERSION, e.g. nvidia-nccl-cu12==2.30.7")
    return pkg, ver


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", action="append", type=Path, default=[], help="wheel(s) to read (first = reference)")
    ap.add_argument("--release", action="append", type=parse_release, default=[],
                    help="extra PACKAGE==VERSION to download and include (e.g. nvidia-nccl-cu12==2.30.7)")
    ap.add_argument("--lib", type=Path, help="read one unpacked libnccl.so.2 instead of wheels")
    ap.add_argument("--out", default=str(DEFAULT_FIXTURE), help="output JSON path, '-' for stdout")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        if args.lib:
            fixture = build_fixture({str(args.lib): extract_lib(args.lib)})
        else:
            wheels = args.wheel or [ensure_wheel(p, v) for p, v in DEFAULT_RELEASES]
            wheels += [ensure_wheel(p, v) for p, v in args.release]
            fixture = extract_wheels(wheels, log)
    except AbiExtractError as e:
        print(f"extract_nccl_abi: {e}", file=sys.stderr)
        return 2
    text = json.dumps(fixture, indent=1, sort_keys=False) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    log(f"done in {time.monotonic() - t0:.1f}s; disagreements: {fixture['disagreements'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
