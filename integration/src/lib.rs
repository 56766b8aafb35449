//! Fixture upstreams and the benchmark driver (see the binaries under `src/bin`).
