"""Builds and checks the Function App zip: host.json, the `handler` binary, and function folders, nothing else.

Written in Python (not `zip -r`) because what matters is exact: the zip must record `handler` as an
executable regular file (mode 0755 in the entry's Unix attributes), since the Functions host sets the
execute bit itself only on Linux Consumption and Flex Consumption; on Premium and Dedicated the mode in the
zip is what the file gets. Entries carry a fixed timestamp so the same inputs give the same zip.

    python3 scripts/lib/functionapp_zip.py OUT.zip HOST_JSON HANDLER FUNCTION_DIR...

Prints the listing (mode, size, name) and exits non-zero, naming the problem, if an input is unfit or the
written zip does not read back as intended.
"""

import os
import stat
import sys
import zipfile

# 1980-01-01 is the earliest time a zip entry can hold; any fixed value makes builds repeatable.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
EXECUTABLE = 0o100755
REGULAR = 0o100644
# Never shipped even if someone leaves them in a function folder: secrets and local state.
SKIPPED_NAMES = {"local.settings.json", ".sql-pseudo-trigger", "__pycache__", ".DS_Store"}


class PackageError(Exception):
    """An input or output that is unfit; the message says what to fix."""


def function_files(folder):
    """(path on disk, name in the zip) for every file of one function folder, sorted."""
    folder = os.path.normpath(folder)
    name = os.path.basename(folder)
    if not os.path.isfile(os.path.join(folder, "function.json")):
        raise PackageError(f"{folder} has no function.json: a function folder holds function.json (and sqltrigger.json)")
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_NAMES)
        for n in sorted(names):
            if n.startswith(".") or n in SKIPPED_NAMES:
                continue
            path = os.path.join(root, n)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            files.append((path, f"{name}/{rel}"))
    return files


def plan(host_json, handler, function_dirs):
    """Every entry of the zip as (path on disk, name, mode), checked before anything is written."""
    if not os.path.isfile(host_json):
        raise PackageError(f"{host_json} is missing")
    if not os.path.isfile(handler):
        raise PackageError(f"{handler} is missing: build it first (scripts/package does)")
    if not function_dirs:
        raise PackageError("no function folder given: name at least one (e.g. function-templates/PgOrdersChanged)")
    entries = [(host_json, "host.json", REGULAR), (handler, "handler", EXECUTABLE)]
    seen = {}
    for d in function_dirs:
        name = os.path.basename(os.path.normpath(d))
        if name in ("host.json", "handler") or name in seen:
            raise PackageError(f"two function folders are named {name!r} ({seen.get(name, name)} and {d}): rename one")
        seen[name] = d
        entries += [(path, arc, REGULAR) for path, arc in function_files(d)]
    return entries


def write(out, entries):
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for path, arc, mode in entries:
            info = zipfile.ZipInfo(arc, date_time=FIXED_TIME)
            info.create_system = 3  # Unix: unzip and the Functions host read the mode from external_attr
            info.external_attr = mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as f:
                z.writestr(info, f.read())
    os.replace(tmp, out)


def verify(out, entries):
    """Reads the zip back: exactly the planned names, handler executable, every other entry not."""
    with zipfile.ZipFile(out) as z:
        infos = z.infolist()
        bad = z.testzip()
        if bad is not None:
            raise PackageError(f"{out}: entry {bad} is corrupt")
    names = [i.filename for i in infos]
    if names != [arc for _, arc, _ in entries]:
        raise PackageError(f"{out} holds {names}, expected {[arc for _, arc, _ in entries]}")
    for i in infos:
        mode = i.external_attr >> 16
        want = EXECUTABLE if i.filename == "handler" else REGULAR
        if mode != want or not stat.S_ISREG(mode):
            raise PackageError(f"{out}: {i.filename} has mode {oct(mode)}, expected {oct(want)}")
    return infos


def listing(infos):
    return "\n".join(f"{stat.filemode(i.external_attr >> 16)} {i.file_size:>10} {i.filename}" for i in infos)


def main(argv):
    if len(argv) < 4:
        print("usage: functionapp_zip.py OUT.zip HOST_JSON HANDLER FUNCTION_DIR...", file=sys.stderr)
        return 2
    out, host_json, handler, *function_dirs = argv
    try:
        entries = plan(host_json, handler, function_dirs)
        write(out, entries)
        infos = verify(out, entries)
    except PackageError as e:
        print(f"functionapp_zip: {e}", file=sys.stderr)
        return 1
    print(listing(infos))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
