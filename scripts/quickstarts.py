#!/usr/bin/env python3
"""The README's quickstarts as scripts: the `bash` and `python` blocks of
each `## Quickstart: ...` section, in order, joined into one bash script
(Python blocks run as `python3 - <<'EOF'`), with a marker line after each
block (`@@ block <section> <n> <unix seconds>`) and background jobs killed
at exit. `tests/e2e/test_readme.py` runs them against a real server;
`scripts/newcomer.sh` times them on a clean clone.

    scripts/quickstarts.py README.md "build an app" > app.sh
    scripts/quickstarts.py README.md "run it for others" "provide compute" > ops.sh

A section is named by the start of its title, case-insensitively."""

import re
import sys

FENCE = re.compile(r"^```(\w*)\s*$")


def sections(text):
    """{title: [(lang, code), ...]} for every `## Quickstart: title`."""
    out, title, lang, code = {}, None, None, []
    for line in text.splitlines():
        if lang is not None:
            if line.startswith("```"):
                if title is not None and lang in ("bash", "python"):
                    out[title].append((lang, "\n".join(code)))
                lang, code = None, []
            else:
                code.append(line)
            continue
        m = FENCE.match(line)
        if m:
            lang = m.group(1)
            continue
        if line.startswith("## "):
            name = line[3:].strip()
            title = name[len("Quickstart:"):].strip() if name.startswith("Quickstart:") else None
            if title is not None:
                out[title] = []
    return out


def pick(all_sections, wanted):
    """The sections whose titles start with each of `wanted`, in order."""
    chosen = []
    for w in wanted:
        hits = [t for t in all_sections if t.lower().startswith(w.lower())]
        if len(hits) != 1:
            raise SystemExit(f"quickstarts: `{w}` names {len(hits)} sections of {list(all_sections)}")
        chosen.append(hits[0])
    return chosen


def script(all_sections, titles):
    """One bash script running the blocks of `titles` in order."""
    lines = [
        "#!/usr/bin/env bash",
        "set -eu",
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true' EXIT",
    ]
    for title in titles:
        for n, (lang, code) in enumerate(all_sections[title], 1):
            if lang == "python":
                lines += ["python3 - <<'QUICKSTART_PYTHON'", code, "QUICKSTART_PYTHON"]
            else:
                lines.append(code)
            slug = title.split()[0].lower()
            lines.append(f'printf "\\n@@ block {slug} {n} %s\\n" "$(date +%s.%N)"')
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    with open(argv[1], encoding="utf-8") as f:
        found = sections(f.read())
    sys.stdout.write(script(found, pick(found, argv[2:])))


if __name__ == "__main__":
    main(sys.argv)
