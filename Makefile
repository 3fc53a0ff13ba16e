# hybridrate developer targets. `make test` is what CI runs (see .ci/run); it needs redis-server in PATH.
GO ?= go
MOD := github.com/hybridrate/hybridrate

.PHONY: test test-short race bench lint deps fuzz loadgen sidecar

test: ## all tests, real Redis included, with the race detector (the README's test command)
	$(GO) test -race -count=1 ./...

race: test

test-short: ## fast tests only (skips the multi-second load and fault-injection tests)
	$(GO) test -short -count=1 ./...

bench: ## benchmarks against the peers on a real redis-server, benchstat-ready: benchstat bench.txt
	$(GO) test ./bench -run '^$$' -bench . -benchmem -count 6 -timeout 60m | tee bench.txt

# FUZZTIME is an execution count, not a duration: with a wall-clock -fuzztime, Go 1.26's fuzz
# coordinator can fail a target with a bare "context deadline exceeded" at the deadline on a loaded
# machine, having found nothing (go.dev/issue/75804, fixed in Go 1.27). A count has no deadline to race.
# 20000x takes the slowest target (hybrid.FuzzAllowN) about 5 s on 2 cores, the others about a second.
FUZZTIME ?= 20000x
fuzz: ## run every fuzz target for FUZZTIME executions (seed corpora under testdata/fuzz run in `make test` too); the packages are found, not listed
	@set -e; for pkg in $$(grep -rl '^func Fuzz' --include='*_test.go' . | xargs -n1 dirname | sort -u); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$t"; $(GO) test $$pkg -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME); \
	  done; done

lint: ## gofmt, go vet, staticcheck
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed on:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

deps: ## check the package graph of DESIGN.md: imports flow downward only (internal/ packages and the leaf outcome may be imported by any)
	@$(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./... | awk -v mod="$(MOD)" ' \
	function short(p) { sub(mod "/", "", p); return p } \
	BEGIN { allow["outcome"]=""; allow["local"]=""; allow["denycache"]=""; allow["lua"]=""; allow["central"]="lua"; \
	        allow["strict"]="lua"; allow["internal/redisx"]="lua"; allow["internal/limits"]=""; \
	        allow["sync"]="local central"; allow["relay"]="central"; allow["hybrid"]="local sync denycache central"; \
	        allow["policy"]="hybrid strict"; allow["middleware"]="policy concurrency"; \
	        allow["concurrency"]="lua"; \
	        allow["observe"]="policy hybrid"; allow["sidecar"]="policy hybrid"; \
	        allow["dashboard"]="observe"; } \
	{ pkg = short($$1); if (!(pkg in allow)) next; \
	  for (i = 2; i <= NF; i++) { if (index($$i, mod "/") != 1) continue; dep = short($$i); \
	    if (dep ~ /^internal\// || dep == "outcome") continue; \
	    if (index(" " allow[pkg] " ", " " dep " ") == 0) { printf "deps: %s must not import %s\n", pkg, dep; bad = 1 } } } \
	END { if (bad) exit 1; print "deps: package graph ok" }'

loadgen: ## the default load-generator scenario (embedded Redis)
	$(GO) run ./cmd/loadgen

sidecar: ## the sidecar on an embedded Redis with the built-in policy (gRPC :8081, HTTP :8080)
	$(GO) run ./cmd/hybridrated
