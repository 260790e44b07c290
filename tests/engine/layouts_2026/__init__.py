"""Key -> shape layouts of the 2026 model families, for the detection tests.

Original-codebase namings are written here from each codebase's structure (the module and file are cited
per family); diffusers / transformers namings come from the real classes built on the `meta` device
(`common.meta_shapes`). Where diffusers ships a single-file converter, the tests run it on the original
layout and compare with the meta-device model, so both namings are checked against an independent
reference. Test helpers only: nothing here is part of the product.
"""
