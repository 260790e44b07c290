"""Test support that is not a test: the fixture generators (`tests.support.synth`). Imported as
`tests.support…` with the repository root on sys.path (pytest's `pythonpath`, the benchmarks' own
sys.path line), never by engine/ or app/: none of it ships."""
