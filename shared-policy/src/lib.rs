//! Egress policy: the file format shared by the control plane (which validates and writes it)
//! and the egress gateway (which enforces it). No I/O, no async, no logging.
