// The pause program of the real nodes' pod sandboxes: no dependencies, built like the rest (issue 20).
module kustos.dev/devcluster/pause

go 1.26.0
