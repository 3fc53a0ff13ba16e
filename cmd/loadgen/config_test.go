package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/workload"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
)

func TestParseConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseConfig(nil, nil)
	require.NoError(t, err)
	assert.Equal(t, allModes, c.modes)
	assert.Empty(t, c.redisAddrs)
	assert.Equal(t, defaultNodes, c.nodes)
	assert.Equal(t, 2*defaultNodes, c.concurrency)
	assert.Equal(t, workload.Uniform, c.pattern)
	assert.Equal(t, defaultDuration, c.duration)
	assert.Equal(t, float64(defaultLoad), c.load)
	assert.InDelta(t, defaultLoad*defaultKeys*defaultRate, c.rps, 1e-9, "demand = load × keys × rate / cost")
	assert.Equal(t, outcome.LocalFallback, c.policy)
	assert.Equal(t, hybrid.DefaultSyncInterval, c.syncInterval)
	assert.Equal(t, hybrid.DefaultDriftThreshold, c.drift)
	assert.Equal(t, embeddedSyncTimeout, c.syncTimeout, "the embedded miniredis is slow")
	// The default must finish well under 30s: five modes of defaultDuration.
	assert.Less(t, time.Duration(len(c.modes))*c.duration, 20*time.Second)
}

func TestParseConfigFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, c *config)
	}{
		{"modes are a comma-separated list without repeats", []string{"--mode", "central,hybrid,central"}, func(t *testing.T, c *config) {
			assert.Equal(t, []string{"central", "hybrid"}, c.modes)
		}},
		{"one address is standalone", []string{"--redis", "127.0.0.1:16379"}, func(t *testing.T, c *config) {
			assert.Equal(t, []string{"127.0.0.1:16379"}, c.redisAddrs)
			assert.Equal(t, hybrid.DefaultCheckTimeout, c.syncTimeout, "a real Redis gets the library's default")
		}},
		{"several addresses are listed in order", []string{"--redis", "127.0.0.1:7000, 127.0.0.1:7001"}, func(t *testing.T, c *config) {
			assert.Equal(t, []string{"127.0.0.1:7000", "127.0.0.1:7001"}, c.redisAddrs)
		}},
		{"demand follows load, keys, rate and cost", []string{"--load", "0.9", "--keys", "10", "--rate", "5000", "--burst", "2500", "--cost", "2"}, func(t *testing.T, c *config) {
			assert.InDelta(t, 0.9*10*5000/2, c.rps, 1e-6)
		}},
		{"rps sets the demand directly", []string{"--rps", "1234.5"}, func(t *testing.T, c *config) {
			assert.InDelta(t, 1234.5, c.rps, 1e-9)
			assert.Zero(t, c.load)
		}},
		{"rps max means no pacing", []string{"--rps", "max"}, func(t *testing.T, c *config) {
			assert.Zero(t, c.rps)
		}},
		{"requests alone lift the time limit", []string{"--requests", "1000"}, func(t *testing.T, c *config) {
			assert.Equal(t, int64(1000), c.requests)
			assert.Zero(t, c.duration)
		}},
		{"requests and duration both apply", []string{"--requests", "1000", "--duration", "5s"}, func(t *testing.T, c *config) {
			assert.Equal(t, 5*time.Second, c.duration)
		}},
		{"hot uses one key", []string{"--pattern", "hot"}, func(t *testing.T, c *config) {
			assert.Equal(t, workload.Hot, c.pattern)
			assert.Equal(t, 1, c.keys)
		}},
		{"zipf takes its exponent", []string{"--pattern", "zipf", "--zipf-s", "1.3", "--keys", "100000"}, func(t *testing.T, c *config) {
			assert.Equal(t, workload.Zipf, c.pattern)
			assert.Equal(t, 1.3, c.zipfS)
		}},
		{"hybrid knobs", []string{"--sync-interval", "50ms", "--drift", "0", "--policy", "fail-closed", "--check-timeout", "2ms", "--max-keys", "1000", "--lease-advance", "2s"}, func(t *testing.T, c *config) {
			assert.Equal(t, 2*time.Second, c.leaseAdvance)
			assert.Equal(t, 50*time.Millisecond, c.syncInterval)
			assert.Zero(t, c.drift)
			assert.Equal(t, outcome.FailClosed, c.policy)
			assert.Equal(t, 2*time.Millisecond, c.syncTimeout)
			assert.Equal(t, 1000, c.maxKeys)
		}},
		{"churn takes its demand in requests per second", []string{"--pattern", "churn", "--keys", "1000", "--rps", "500"}, func(t *testing.T, c *config) {
			assert.Equal(t, workload.Churn, c.pattern)
			assert.InDelta(t, 500, c.rps, 1e-9)
		}},
		{"no affinity by default: each worker keeps its node", nil, func(t *testing.T, c *config) {
			assert.False(t, c.routed)
		}},
		{"affinity routes requests by key", []string{"--affinity", "0.9"}, func(t *testing.T, c *config) {
			assert.True(t, c.routed)
			assert.Equal(t, 0.9, c.affinity)
		}},
		{"affinity 0 is a share like any other", []string{"--affinity", "0"}, func(t *testing.T, c *config) {
			assert.True(t, c.routed)
			assert.Zero(t, c.affinity)
		}},
		{"double-dash and single-dash flags both work", []string{"-nodes=3", "--concurrency=3"}, func(t *testing.T, c *config) {
			assert.Equal(t, 3, c.nodes)
			assert.Equal(t, 3, c.concurrency)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseConfig(tt.args, nil)
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestParseConfigScenarios(t *testing.T) {
	t.Parallel()
	type want struct {
		keys            int
		rate            float64
		burst           int64
		load, rps       float64
		pattern         workload.Pattern
		routed          bool
		affinity, zipfS float64
	}
	tests := []struct {
		name string
		want want
	}{
		{"hot", want{keys: 16, rate: 2000, burst: 400, load: 0.8, rps: 0.8 * 16 * 2000, pattern: workload.Uniform}},
		{"medium", want{keys: 200, rate: 100, burst: 100, load: 0.8, rps: 0.8 * 200 * 100, pattern: workload.Uniform}},
		{"sparse", want{keys: 2000, rate: 10, burst: 20, load: 0.5, rps: 0.5 * 2000 * 10, pattern: workload.Uniform}},
		{"sticky", want{keys: 2000, rate: 10, burst: 20, load: 0.5, rps: 0.5 * 2000 * 10, pattern: workload.Uniform, routed: true, affinity: 0.9}},
		{"zipf", want{keys: 2000, rate: 10, burst: 20, load: 0.5, rps: 0.5 * 2000 * 10, pattern: workload.Zipf, zipfS: 1.1}},
		{"overload", want{keys: 200, rate: 100, burst: 100, load: 4, rps: 4 * 200 * 100, pattern: workload.Uniform}},
		{"churn", want{keys: 100_000, rate: 10, burst: 20, rps: 4000, pattern: workload.Churn}},
	}
	require.Len(t, tests, len(presets), "every preset is tested")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseConfig([]string{"--scenario", tt.name}, nil)
			require.NoError(t, err)
			w := tt.want
			assert.Equal(t, tt.name, c.scenario)
			assert.Equal(t, []string{"hybrid", "central"}, c.modes)
			assert.Equal(t, 8, c.nodes)
			assert.Equal(t, 10*time.Second, c.duration)
			assert.Equal(t, w.keys, c.keys)
			assert.Equal(t, w.rate, c.rate)
			assert.Equal(t, w.burst, c.burst)
			assert.InDelta(t, w.load, c.load, 1e-12)
			assert.InDelta(t, w.rps, c.rps, 1e-9)
			assert.Equal(t, w.pattern, c.pattern)
			assert.Equal(t, w.routed, c.routed)
			assert.Equal(t, w.affinity, c.affinity)
			if w.pattern == workload.Zipf {
				assert.Equal(t, w.zipfS, c.zipfS)
			}
			// The library's defaults.
			assert.Equal(t, hybrid.DefaultSyncInterval, c.syncInterval)
			assert.Equal(t, hybrid.DefaultDriftThreshold, c.drift)
		})
	}

	t.Run("flags given override the preset", func(t *testing.T) {
		t.Parallel()
		c, err := parseConfig([]string{"--scenario", "sticky", "--affinity", "0.5", "--duration", "3s", "--keys", "100", "--mode", "hybrid"}, nil)
		require.NoError(t, err)
		assert.Equal(t, 0.5, c.affinity)
		assert.Equal(t, 3*time.Second, c.duration)
		assert.Equal(t, 100, c.keys)
		assert.Equal(t, []string{"hybrid"}, c.modes)
		assert.InDelta(t, 0.5*100*10, c.rps, 1e-9, "the preset's load over the keys given")
	})
	t.Run("either demand flag replaces the preset's demand", func(t *testing.T) {
		t.Parallel()
		c, err := parseConfig([]string{"--scenario", "overload", "--rps", "100"}, nil)
		require.NoError(t, err)
		assert.InDelta(t, 100, c.rps, 1e-9)
		assert.Zero(t, c.load)
		c, err = parseConfig([]string{"--scenario", "churn", "--rps", "1000"}, nil)
		require.NoError(t, err)
		assert.InDelta(t, 1000, c.rps, 1e-9)
		c, err = parseConfig([]string{"--scenario", "sparse", "--load", "2"}, nil)
		require.NoError(t, err)
		assert.InDelta(t, 2*2000*10, c.rps, 1e-9)
	})
	t.Run("requests alone still lift the preset's time limit", func(t *testing.T) {
		t.Parallel()
		c, err := parseConfig([]string{"--scenario", "hot", "--requests", "1000"}, nil)
		require.NoError(t, err)
		assert.Zero(t, c.duration)
	})
	t.Run("every preset is in the help", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		_, err := parseConfig([]string{"-h"}, &out)
		require.ErrorIs(t, err, errHelp)
		for _, n := range presetNames {
			assert.Regexp(t, `(?m)^  `+n+` +\S`, out.String())
		}
	})
}

func TestParseConfigRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "fast"}, `unknown mode "fast"`},
		{[]string{"--mode", ""}, `unknown mode ""`},
		{[]string{"--redis", "localhost"}, `bad address "localhost"`},
		{[]string{"--redis", "127.0.0.1:1,"}, `bad address ""`},
		{[]string{"--sentinel-master", "mymaster"}, "needs --redis"},
		{[]string{"--nodes", "0"}, "--nodes 0"},
		{[]string{"--lease-advance", "-1s"}, "--lease-advance -1s"},
		{[]string{"--nodes", "5000"}, "--nodes 5000"},
		{[]string{"--keys", "0"}, "--keys 0"},
		{[]string{"--pattern", "hot", "--keys", "5"}, "single key"},
		{[]string{"--pattern", "gauss"}, `unknown pattern "gauss"`},
		{[]string{"--pattern", "zipf", "--zipf-s", "1"}, "--zipf-s 1"},
		{[]string{"--affinity", "-0.1"}, "--affinity -0.1"},
		{[]string{"--affinity", "1.5"}, "--affinity 1.5"},
		{[]string{"--affinity", "NaN"}, "--affinity NaN"},
		{[]string{"--pattern", "churn", "--rps", "100"}, "want --keys above 4"},
		{[]string{"--pattern", "churn", "--keys", "1000"}, "needs --rps"},
		{[]string{"--scenario", "spiky"}, `--scenario "spiky": want one of hot, medium, sparse, sticky, zipf, overload, churn`},
		{[]string{"--scenario", "churn", "--load", "0.5"}, "needs --rps"},
		{[]string{"--scenario", "sticky", "--affinity", "2"}, "--affinity 2"},
		{[]string{"--rate", "0"}, "--rate 0"},
		{[]string{"--rate", "NaN"}, "--rate NaN"},
		{[]string{"--rate", "2e9"}, "--rate 2e+09"},
		{[]string{"--burst", "0"}, "--burst 0"},
		{[]string{"--cost", "0"}, "--cost 0"},
		{[]string{"--cost", "300", "--burst", "200"}, "--cost 300"},
		{[]string{"--duration", "-1s"}, "--duration -1s"},
		{[]string{"--duration", "0"}, "needs --requests"},
		{[]string{"--requests", "-5"}, "--requests -5"},
		{[]string{"--concurrency", "-1"}, "--concurrency -1"},
		{[]string{"--nodes", "8", "--concurrency", "4"}, "at least --nodes"},
		{[]string{"--sync-interval", "0s"}, "--sync-interval 0s"},
		{[]string{"--drift", "1.5"}, "--drift 1.5"},
		{[]string{"--drift", "-0.1"}, "--drift -0.1"},
		{[]string{"--policy", "yolo"}, `--policy "yolo"`},
		{[]string{"--check-timeout", "1µs"}, "--check-timeout 1µs"},
		{[]string{"--sync-timeout", "1ms"}, "flag provided but not defined: -sync-timeout"},
		{[]string{"--max-keys", "10"}, "--max-keys 10"},
		{[]string{"--load", "0"}, "--load 0"},
		{[]string{"--load", "-2"}, "--load -2"},
		{[]string{"--load", "4", "--rps", "100"}, "give one"},
		{[]string{"--rps", "fast"}, `--rps "fast"`},
		{[]string{"--rps", "0"}, `--rps "0"`},
		{[]string{"--keys", "100000000", "--rate", "1e9", "--load", "1000"}, "would be"},
		{[]string{"--progress", "sometimes"}, `--progress "sometimes"`},
		{[]string{"--plot", "out.png"}, "ending in .svg"},
		{[]string{"--nodes", "two"}, `invalid value "two"`},
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
		{[]string{"stray"}, `unexpected argument "stray"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			_, err := parseConfig(tt.args, nil)
			var ue *usageError
			require.True(t, errors.As(err, &ue), "want a usage error, got %v", err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "\n", "one line")
		})
	}
}

func TestParseConfigHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, err := parseConfig([]string{"--help"}, &out)
	assert.ErrorIs(t, err, errHelp)
	assert.Contains(t, out.String(), "Usage: loadgen [flags]")
	assert.Contains(t, out.String(), "-sync-interval")
}
