#!/usr/bin/env python3
"""Prints the demo's predictions (written by `tensord predict`) next to the true Fashion-MNIST labels."""
import sys

import numpy as np

from make_demo import CLASSES

probs = np.load(sys.argv[1])
labels = np.load(sys.argv[2])
pred = probs.argmax(1)
for i, (p, y) in enumerate(zip(pred, labels)):
    print(f"image {i:2d}: predicted {CLASSES[p]:<12} ({probs[i, p]:.2f})  true {CLASSES[y]:<12} {'ok' if p == y else 'MISS'}")
print(f"{int((pred == labels).sum())}/{len(labels)} correct")
