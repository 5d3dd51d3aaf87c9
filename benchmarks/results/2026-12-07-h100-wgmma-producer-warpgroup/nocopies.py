"""A diagnostic patch (not the library's): the forward kernel copies nothing. The barrier build's stages skip their
gather; the PRODUCER build's producer arrives on each stage's full barrier without copying. The products multiply
whatever the stages hold; what is left of the time is each pipeline's own."""
import re
import sys

path = sys.argv[1]
source = open(path).read()
patched, count = re.subn(r"\n {16}gather\.copy_stage\(.*?\);\n {16}arrive_when_copied\(full \+ 8 \* stage\);",
                         "\n                barrier_arrive(full + 8 * stage);", source, flags=re.S)
assert count == 1, count
patched, count = re.subn(r"\n {8}gather\.copy_stage\(.*?\}\);\n", "\n", patched, count=1, flags=re.S)
assert count == 1, count
open(path, "w").write(patched)
