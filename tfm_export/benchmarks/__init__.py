"""The benchmark runs `make bench`, `make bench-anchor`, `make bench-opus`, `make bench-scale` and
`make bench-serving` make, each a module run as `python -m tfm_export.benchmarks.<name>` with its own --help:

- interleaved: repeated, interleaved rounds of `tfm-run bench`'s measurement beside CTranslate2, and the targets
  table over their reports;
- fixed_shapes, startup, prepacked_steps: what the device backend's fixed shapes, the first translation and the
  pre-packed graphs cost;
- scale: large models through every stage beside CTranslate2's converter and translator;
- serving_load: the translator layout on a real tritonserver under concurrent load;
- plot: one PNG of `make bench`'s reports;
- marian_shape, m2m100_shape: random Hugging Face directories of published models' shapes to run them on.

They drive the measuring library (bench), the demo, the serving package and the CLI's entry, so they come last in
the package order. One-off investigations the docs cite live in experiments/, outside the package.
"""
