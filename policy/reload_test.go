package policy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/policy"
)

// writeFile replaces path atomically, as editors and config managers do.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// eventually polls cond every 5ms until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const limitOf = `version: 1
rules:
  - id: per-key
    algorithm: gcra
    dimensions: [api_key]
    limit: %LIMIT%
    period: 1h
`

func TestReloadValidAndInvalidFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, strings.Replace(limitOf, "%LIMIT%", "2", 1))

	var mu sync.Mutex
	var reloads []*policy.Policy
	var errs []error
	rl, err := policy.NewReloader(
		path,
		e.enf,
		policy.WithReloadInterval(10*time.Millisecond),
		policy.WithOnReload(func(p *policy.Policy) { mu.Lock(); reloads = append(reloads, p); mu.Unlock() }),
		policy.WithOnReloadError(func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }),
	)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
	})
	limit := func() int64 {
		res := e.check(t, req("GET", "/", "api_key", "probe"))
		return res.Decisions[0].Limit
	}
	assert.Equal(t, int64(2), limit(), "NewReloader put the file in force")

	// A valid change takes effect without a restart.
	writeFile(t, path, strings.Replace(limitOf, "%LIMIT%", "5", 1))
	eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(reloads) == 1 }, "OnReload after a valid change")
	assert.Equal(t, int64(5), limit())

	// An invalid file is rejected with its line, and the previous policy stays in force.
	writeFile(t, path, strings.Replace(limitOf, "%LIMIT%", "-1", 1))
	eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(errs) == 1 }, "OnError after an invalid change")
	mu.Lock()
	assert.ErrorIs(t, errs[0], policy.ErrInvalid)
	assert.True(t, strings.HasPrefix(errs[0].Error(), path+":6:12: rule \"per-key\": limit -1"), errs[0].Error())
	mu.Unlock()
	assert.Equal(t, int64(5), limit(), "the previous policy is still in force")

	// The same bad content is reported once, not at every look.
	require.NoError(t, rl.Reload())
	time.Sleep(50 * time.Millisecond) // five more looks by Run
	mu.Lock()
	assert.Len(t, errs, 1)
	mu.Unlock()

	// A syntax error names its line too.
	writeFile(t, path, "version: 1\nrules:\n  - id: a\n   rate: 1\n")
	eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(errs) == 2 }, "OnError after a syntax error")
	mu.Lock()
	assert.True(t, strings.HasPrefix(errs[1].Error(), path+":4: syntax error"), errs[1].Error())
	mu.Unlock()

	// Fixed: in force again.
	writeFile(t, path, strings.Replace(limitOf, "%LIMIT%", "7", 1))
	eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(reloads) == 2 }, "OnReload after the fix")
	assert.Equal(t, int64(7), limit())
	assert.Equal(t, int64(3), e.enf.Stats().Reloads, "2, 5 and 7, and no other")
}

func TestNewReloaderRejectsABadFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	path := filepath.Join(t.TempDir(), "policy.json")
	writeFile(t, path, "{\"rules\": [{\"id\": \"a\", \"rate\": 1}]}")
	_, err := policy.NewReloader(path, e.enf)
	require.ErrorIs(t, err, policy.ErrInvalid)
	assert.Contains(t, err.Error(), "policy.json:1:24: rule \"a\": rate without burst")
	assert.Nil(t, e.enf.Policy())

	_, err = policy.NewReloader(filepath.Join(t.TempDir(), "none.yaml"), e.enf)
	assert.Error(t, err)
	_, err = policy.NewReloader("", e.enf)
	assert.ErrorIs(t, err, policy.ErrBadOption)
	_, err = policy.NewReloader(path, nil)
	assert.ErrorIs(t, err, policy.ErrBadOption)
}

func TestReloaderIntervalBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, strings.Replace(limitOf, "%LIMIT%", "2", 1))
	_, err := policy.NewReloader(path, e.enf, policy.WithReloadInterval(time.Microsecond))
	assert.ErrorContains(t, err, "want at least 1ms")
}
