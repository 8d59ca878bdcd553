// Pins porcupine, the linearizability checker the proof suite runs on recorded etcd histories
// (main.go: the etcd KV model and the command around it).
module kustos.dev/devcluster/porcupine

go 1.26.0

require github.com/anishathalye/porcupine v1.3.1
