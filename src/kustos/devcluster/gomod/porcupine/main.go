// Command kustos-linearizability decides whether a history recorded by kustos's proof
// recorder (src/kustos/proof/history.py) is linearizable against a sequential model of
// etcd's KV store, with porcupine.
//
// The model is the whole keyspace under the recorder's prefix plus the store revision, not
// one partition per key: etcd gives every write one global revision, and a read answers with
// the revision it was served at, so a history is only linearizable if one total order
// explains every key's values and every revision together. The recorder is the only writer,
// so every applied write moves the revision by exactly one.
//
// An indeterminate write (no answer) never returns: porcupine may place it anywhere after
// its call, and placing it after everything else is the same as never applying it.
//
// Usage: kustos-linearizability [-timeout 60s] [-html report.html] HISTORY.jsonl (- reads stdin)
// Prints one JSON object: {"result": "Ok"|"Illegal"|"Unknown", "operations": N, ...}.
// Exit status: 0 linearizable, 1 not, 2 undecided within the timeout, 3 bad input.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type read struct {
	Value       string `json:"value"`
	ModRevision int64  `json:"mod_revision"`
}

// line is any line of the history file; only the header's and the operations' fields are used.
type line struct {
	Type string `json:"type"`

	// header
	InitialRevision int64           `json:"initial_revision"`
	Initial         map[string]read `json:"initial"`

	// op
	Client              int     `json:"client"`
	Kind                string  `json:"kind"`
	Key                 string  `json:"key"`
	Call                int64   `json:"call"`
	Ret                 *int64  `json:"ret"`
	Outcome             string  `json:"outcome"`
	Value               *string `json:"value"`
	ExpectedModRevision int64   `json:"expected_mod_revision"`
	Revision            int64   `json:"revision"`
	Read                *read   `json:"read"`
	Deleted             int64   `json:"deleted"`
	Succeeded           bool    `json:"succeeded"`
}

type input struct {
	kind        string
	key         string
	value       string
	expectedMod int64
}

type output struct {
	indeterminate bool
	revision      int64
	read          *read
	deleted       int64
	succeeded     bool
}

// state is immutable: a step copies the map before it changes it.
type state struct {
	revision int64
	kvs      map[string]read
}

func (s state) with(key string, kv *read, revision int64) state {
	kvs := make(map[string]read, len(s.kvs)+1)
	for k, v := range s.kvs {
		kvs[k] = v
	}
	if kv == nil {
		delete(kvs, key)
	} else {
		kvs[key] = *kv
	}
	return state{revision: revision, kvs: kvs}
}

func sameRead(current read, present bool, seen *read) bool {
	if !present {
		return seen == nil
	}
	return seen != nil && *seen == current
}

func step(st, in, out interface{}) (bool, interface{}) {
	s := st.(state)
	i := in.(input)
	o := out.(output)
	current, present := s.kvs[i.key]
	next := s.revision + 1
	switch i.kind {
	case "get":
		return o.revision == s.revision && sameRead(current, present, o.read), s
	case "put":
		if !o.indeterminate && o.revision != next {
			return false, s
		}
		return true, s.with(i.key, &read{i.value, next}, next)
	case "delete":
		if o.indeterminate {
			if !present {
				return true, s
			}
			return true, s.with(i.key, nil, next)
		}
		if !present {
			return o.deleted == 0 && o.revision == s.revision, s
		}
		return o.deleted == 1 && o.revision == next, s.with(i.key, nil, next)
	case "txn":
		holds := (!present && i.expectedMod == 0) || (present && current.ModRevision == i.expectedMod)
		if o.indeterminate {
			if !holds {
				return true, s
			}
			return true, s.with(i.key, &read{i.value, next}, next)
		}
		if holds {
			return o.succeeded && o.revision == next, s.with(i.key, &read{i.value, next}, next)
		}
		return !o.succeeded && o.revision == s.revision && sameRead(current, present, o.read), s
	}
	return false, s
}

func equal(a, b interface{}) bool {
	x, y := a.(state), b.(state)
	if x.revision != y.revision || len(x.kvs) != len(y.kvs) {
		return false
	}
	for k, v := range x.kvs {
		if w, ok := y.kvs[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func describeState(st interface{}) string {
	s := st.(state)
	keys := make([]string, 0, len(s.kvs))
	for k := range s.kvs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%s@%d", k, s.kvs[k].Value, s.kvs[k].ModRevision))
	}
	return fmt.Sprintf("rev %d {%s}", s.revision, strings.Join(parts, " "))
}

func describeOperation(in, out interface{}) string {
	i, o := in.(input), out.(output)
	call := fmt.Sprintf("%s(%s)", i.kind, i.key)
	switch i.kind {
	case "put":
		call = fmt.Sprintf("put(%s, %s)", i.key, i.value)
	case "txn":
		call = fmt.Sprintf("txn(%s mod==%d ? put %s)", i.key, i.expectedMod, i.value)
	}
	if o.indeterminate {
		return call + " -> ?"
	}
	answer := fmt.Sprintf("rev %d", o.revision)
	if o.read != nil {
		answer += fmt.Sprintf(" %s@%d", o.read.Value, o.read.ModRevision)
	}
	if i.kind == "txn" {
		answer += fmt.Sprintf(" succeeded=%t", o.succeeded)
	}
	if i.kind == "delete" {
		answer += fmt.Sprintf(" deleted=%d", o.deleted)
	}
	return call + " -> " + answer
}

func load(path string) (state, []porcupine.Operation, error) {
	file := os.Stdin
	if path != "-" {
		opened, err := os.Open(path)
		if err != nil {
			return state{}, nil, err
		}
		defer opened.Close()
		file = opened
	}
	scanner := bufio.NewScanner(file)
	scanner.Buffer(make([]byte, 1<<20), 1<<26)
	var init *state
	var ops []porcupine.Operation
	number := 0
	for scanner.Scan() {
		number++
		if strings.TrimSpace(scanner.Text()) == "" {
			continue
		}
		var l line
		if err := json.Unmarshal(scanner.Bytes(), &l); err != nil {
			return state{}, nil, fmt.Errorf("%s:%d: %v", path, number, err)
		}
		switch l.Type {
		case "header":
			kvs := map[string]read{}
			for k, v := range l.Initial {
				kvs[k] = v
			}
			init = &state{revision: l.InitialRevision, kvs: kvs}
		case "op":
			if l.Outcome == "failed" {
				continue // certainly without effect
			}
			if l.Kind == "get" && l.Outcome != "ok" {
				continue // a read without an answer changes nothing
			}
			in := input{kind: l.Kind, key: l.Key, expectedMod: l.ExpectedModRevision}
			if l.Value != nil {
				in.value = *l.Value
			}
			out := output{indeterminate: l.Outcome == "indeterminate", revision: l.Revision, read: l.Read,
				deleted: l.Deleted, succeeded: l.Succeeded}
			ret := int64(math.MaxInt64)
			if !out.indeterminate {
				if l.Ret == nil {
					return state{}, nil, fmt.Errorf("%s:%d: field 'ret' is missing", path, number)
				}
				ret = *l.Ret
			}
			ops = append(ops, porcupine.Operation{ClientId: l.Client, Input: in, Call: l.Call, Output: out, Return: ret})
		}
	}
	if err := scanner.Err(); err != nil {
		return state{}, nil, err
	}
	if init == nil {
		return state{}, nil, fmt.Errorf("%s: no header line", path)
	}
	return *init, ops, nil
}

func main() {
	timeout := flag.Duration("timeout", time.Minute, "give up (result Unknown) after this long")
	html := flag.String("html", "", "write porcupine's visualization of the history here when it is not linearizable")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: kustos-linearizability [-timeout 60s] [-html FILE] HISTORY.jsonl")
		os.Exit(3)
	}
	initial, ops, err := load(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	model := porcupine.Model{
		Init:              func() interface{} { return initial },
		Step:              step,
		Equal:             equal,
		Hash:              func(st interface{}) uint64 { return uint64(st.(state).revision) },
		DescribeOperation: describeOperation,
		DescribeState:     describeState,
	}
	started := time.Now()
	result, info := porcupine.CheckOperationsVerbose(model, ops, *timeout)
	report := map[string]interface{}{
		"result":     string(result),
		"operations": len(ops),
		"seconds":    time.Since(started).Seconds(),
	}
	if result == porcupine.Illegal {
		// The longest prefix porcupine could linearize: where the history stops making sense.
		longest := 0
		for _, partition := range info.PartialLinearizations() {
			for _, linearization := range partition {
				if len(linearization) > longest {
					longest = len(linearization)
				}
			}
		}
		report["longest_linearizable_prefix"] = longest
		if *html != "" {
			if err := porcupine.VisualizePath(model, info, *html); err != nil {
				fmt.Fprintln(os.Stderr, err)
			} else {
				report["visualization"] = *html
			}
		}
	}
	encoded, _ := json.Marshal(report)
	fmt.Println(string(encoded))
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		os.Exit(1)
	default:
		os.Exit(2)
	}
}
