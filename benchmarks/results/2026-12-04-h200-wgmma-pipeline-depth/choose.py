# Scratch: the build with the least summed kernel time per tile width, from wgmma-pipeline-after.json.
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
choice = []
for width in (128, 64):
    totals = {}
    for row in rows:
        if row["block_n"] != width:
            continue
        for key, value in row.items():
            if key.startswith("ms "):
                totals[key[3:]] = totals.get(key[3:], 0.0) + value
    print(width, {k: round(v, 4) for k, v in totals.items()}, file=sys.stderr)
    choice.append(f"{width}={min(totals, key=totals.get)}")
print(";".join(choice))
