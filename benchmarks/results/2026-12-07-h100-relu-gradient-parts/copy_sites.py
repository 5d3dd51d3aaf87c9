"""Session 27: which lines of minidnn run copies and fills in an eager ResNet-18 b128 TF32 channels-last step: every
executed line of the library whose text assigns into an array or copies or fills one, counted over one step (after two
warm-ups) with sys.settrace. Host-side only; no timing. Writes the table to argv[1]."""
import collections, os, re, sys
import numpy as np
import cupy
import minidnn
import models
from minidnn.primitives import _cuda

PATTERN = re.compile(r"\[[^\]]*\]\s*=[^=]|ascontiguousarray\(|\.copy\(|\.fill\(|\bcopyto\(|astype\(")
root = os.path.dirname(minidnn.__file__)
wanted = {}
for folder, _, files in os.walk(root):
    for name in files:
        if name.endswith(".py"):
            path = os.path.join(folder, name)
            for number, text in enumerate(open(path), 1):
                if PATTERN.search(text) and not text.lstrip().startswith("#"):
                    wanted[(path, number)] = text.strip()
_cuda.set_allow_tf32(True)
model = models.create("resnet18", num_classes=1000).to("cuda").to(memory_format=minidnn.channels_last)
optimizer = minidnn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
rng = np.random.default_rng(0)
x = minidnn.tensor(rng.standard_normal((128, 3, 224, 224)).astype(np.float32), device="cuda").to(
    memory_format=minidnn.channels_last)
target = minidnn.tensor(rng.integers(0, 1000, 128), device="cuda")
hits = collections.Counter()


def tracer(frame, event, arg):
    if not frame.f_code.co_filename.startswith(root):
        return None
    return local


def local(frame, event, arg):
    if event == "line":
        key = (frame.f_code.co_filename, frame.f_lineno)
        if key in wanted:
            hits[key] += 1
    return local


for step in range(3):
    if step == 2:
        sys.settrace(tracer)
    loss = minidnn.functional.cross_entropy(model(x), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    sys.settrace(None)
cupy.cuda.Device().synchronize()
with open(sys.argv[1], "w") as out:
    for (path, number), count in sorted(hits.items(), key=lambda item: -item[1]):
        out.write(f"{count:4d}  {os.path.relpath(path, root)}:{number}  {wanted[(path, number)][:110]}\n")
print(open(sys.argv[1]).read())
