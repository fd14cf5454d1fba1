# sluice — the two commands a newcomer needs:
#   make run    local services up (installed if missing), migrations applied, `sluice dev` serving
#   make test   local services up, vet, staticcheck, unit tests with -race, fuzz, integration tests
GO       ?= go
BIN      := bin/sluice
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
# Packages that need no services run under -race; integration/ talks to MariaDB and NATS.
UNIT     = $(shell $(GO) list ./... | grep -v /integration)

.PHONY: run test test-galera test-galera-all build services vet lint unit fuzz integration bench benchcmp clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/sluice

services:
	bash deploy/local/setup.sh

# `sluice dev` embeds a NATS server when SLUICE_NATS_URL is unset; `make run` uses the local one
# that `services` started, unless the environment names another.
run: services build
	$(BIN) migrate up
	SLUICE_NATS_URL="$${SLUICE_NATS_URL:-nats://127.0.0.1:4222}" $(BIN) dev

test: services vet lint unit fuzz integration

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

lint:
	@command -v staticcheck >/dev/null 2>&1 || test -x "$$($(GO) env GOPATH)/bin/staticcheck" || \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...

unit:
	$(GO) test -race -count=1 $(UNIT)

integration:
	$(GO) test -race -count=1 -p 2 -timeout 30m ./integration/...

# The store's conformance tests and the Galera tests (integration/galera_test.go) against a
# fresh 3-node Galera cluster on loopback behind HAProxy (deploy/galera/cluster.sh), which is
# deleted afterwards: about 2 minutes here; CI runs it after `make test`. The tests that run
# several processes against the cluster fail if a node's memory grows by a gigabyte
# (deploy/RUNBOOK.md, "The nodes' memory").
GALERA_DSN := root@tcp(127.0.0.1:3310)/
GALERA_TESTS := Galera|IDStep|FrontDoorIdempotency|ThreeDrainerProcesses|DrainerSIGKILL|StateMachineProperties
test-galera: services
	bash deploy/galera/cluster.sh down
	bash deploy/galera/cluster.sh up
	SLUICE_TEST_MYSQL_DSN='$(GALERA_DSN)' SLUICE_TEST_GALERA=1 $(GO) test -count=1 -p 1 -timeout 20m ./gate/store ./outbox \
		&& SLUICE_TEST_MYSQL_DSN='$(GALERA_DSN)' SLUICE_TEST_GALERA=1 $(GO) test -count=1 -p 1 -timeout 20m \
			-run '$(GALERA_TESTS)' ./gate/api ./integration/; \
	status=$$?; bash deploy/galera/cluster.sh status; bash deploy/galera/cluster.sh down; exit $$status

# Every package's tests against a fresh cluster, as test-galera runs its chosen set: what finds
# what Galera treats differently from one server. About 6 minutes here; not in CI, where
# test-galera's set runs.
test-galera-all: services
	bash deploy/galera/cluster.sh down
	bash deploy/galera/cluster.sh up
	SLUICE_TEST_MYSQL_DSN='$(GALERA_DSN)' SLUICE_TEST_GALERA=1 $(GO) test -count=1 -p 1 -timeout 45m ./...; \
	status=$$?; bash deploy/galera/cluster.sh status; bash deploy/galera/cluster.sh down; exit $$status

# A short run of every fuzz target (the seed corpora also run as plain tests in `unit`). The
# budget is a count of executions, not a duration: with a duration, Go 1.26's fuzz coordinator
# can report its own deadline as a failure on a loaded machine (golang/go#75804, fixed in 1.27),
# with no failing input found.
FUZZTIME ?= 20000x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZTIME) ./gate
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeBatch$$' -fuzztime $(FUZZTIME) ./gate/api
	$(GO) test -run '^$$' -fuzz '^FuzzCursor$$' -fuzztime $(FUZZTIME) ./gate/api
	$(GO) test -run '^$$' -fuzz '^FuzzJobJSON$$' -fuzztime $(FUZZTIME) ./gate/job

clean:
	rm -rf bin

# Benchmarks print one JSON line per figure ({"bench": ...}); each figure is reported beside the
# raw limit measured in the same run (same transaction against the same database, raw JetStream
# publish), because these machines are shared and noisy. With the peers beside the project
# (PEERS, ../shared/peers: River on PostgreSQL, Asynq on Redis), `make bench` runs them first in
# the same run and prints each sluice figure beside its peer's (integration/benchtool peers).
# BENCH picks benchmarks (go test -bench), PEER_MEASURES what run.sh runs (river, asynq or all).
PEERS         ?= ../shared/peers
PEER_MEASURES ?= river asynq
BENCH         ?= .
bench: services
	@out=$$(mktemp); peers=$$(mktemp); status=0; \
	if [ -f "$(PEERS)/run.sh" ]; then \
		if bash deploy/local/peers.sh >&2; then \
			for m in $(PEER_MEASURES); do bash "$(PEERS)/run.sh" $$m >> $$peers || status=$$?; done; \
		else status=1; echo "bench: PostgreSQL or Redis did not start: sluice's figures only" >&2; fi; \
	else echo "bench: no peers at $(PEERS): sluice's figures only" >&2; fi; \
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime 1x -timeout 60m ./integration/... > $$out 2>&1 || status=$$?; \
	grep '^{"bench"' $$out; \
	if [ -s $$peers ]; then grep '^{' $$peers; echo; $(GO) run ./integration/benchtool peers -sluice $$out -peers $$peers; fi; \
	if [ $$status -ne 0 ]; then grep -v '^{"bench"' $$out | grep -v '^\[mysql\]' | tail -40; fi; \
	rm -f $$out $$peers; exit $$status

# Compares the working tree with BASE (a revision) by alternated rounds of the hot-path
# benchmarks, and prints each figure's medians, their ratio and in how many rounds the working
# tree lost: `make benchcmp BASE=v0.4 ROUNDS=5 BENCH='BenchmarkAdmission$$'`. HEAD=<revision>
# compares two commits instead, to bisect a loss; FIELDS='<regexp>' picks the metrics printed
# (default: rates, p50s and p99s, ratios). A loss that holds across rounds is a regression to fix
# or to justify.
ROUNDS   ?= 5
CMPBENCH ?= BenchmarkAdmission$$|BenchmarkDrainThroughput$$|BenchmarkPickupLatency$$
benchcmp: services
	@test -n "$(BASE)" || { echo "benchcmp: BASE=<revision> is required"; exit 2; }
	$(GO) run ./integration/benchtool compare -base '$(BASE)' $(if $(HEAD),-head '$(HEAD)') $(if $(FIELDS),-fields '$(FIELDS)') -rounds $(ROUNDS) -bench '$(if $(filter-out .,$(BENCH)),$(BENCH),$(CMPBENCH))'
