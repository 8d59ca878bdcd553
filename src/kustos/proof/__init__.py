"""The proof suite's tooling: record histories of clients on an etcd cluster and check them.

Test tooling, not operator code: import contracts keep the operator from reaching it.
``history`` is the file format, ``recorder`` writes it, ``check`` decides it (linearizability
with porcupine, watch guarantees, acknowledged writes lost, the longest write outage);
``catalogue`` lists the operator actions a scenario must prove, ``soak`` judges whether the
operator stayed flat while scenarios looped.
See docs/proof.md.
"""
