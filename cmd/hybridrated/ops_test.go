package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/logtest"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

// post asks /v1/check for one api_key descriptor and returns the status code.
func post(t *testing.T, base, key string) int {
	t.Helper()
	resp, err := http.Post(base+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"`+key+`"}]}]}`))
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// admitted returns how many of n checks of key were admitted.
func admitted(t *testing.T, base, key string, n int) int {
	t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		if post(t, base, key) == http.StatusOK {
			ok++
		}
	}
	return ok
}

// TestProcessSignalsReloadsAndLogs runs the built binary on a real redis-server: JSON logs at the
// chosen level; SIGHUP reloads the policy (it used to kill the process); reloads are counted in the
// metrics and reported in /readyz's body, failures included; SIGTERM keeps serving for the grace
// period while /readyz says not ready, then the process drains and exits 0 (issue 23).
func TestProcessSignalsReloadsAndLogs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	srv := redistest.Start(t)
	dir := t.TempDir()
	bin := buildBinary(t)
	path := writePolicy(t, dir, testPolicy) // per-key: limit 3 per minute
	cmd := exec.Command(bin, "-redis", srv.Addr, "-policy", path, "-reload", "1h", "-grpc", "127.0.0.1:0",
		"-http", "127.0.0.1:0", "-shutdown-grace", "1500ms", "-log-level", "debug")
	cmd.Env = append(os.Environ(), "HYBRIDRATED_LOG_FORMAT=json")
	var stderr logtest.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	var base string
	require.Eventually(t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		for sc.Scan() {
			var line struct{ Msg, HTTP string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "hybridrated serving" {
				base = "http://" + line.HTTP
				return true
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "the serving line: %s", stderr.String())
	code, body := get(t, base+"/readyz")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "ready\npolicy: "+path+", 2 rules")
	assert.Contains(t, body, "reloads: 1 ok, 0 failed")
	assert.Equal(t, 3, admitted(t, base, "a", 5), "limit 3")

	// SIGHUP: the file is read now (the -reload poll is an hour away).
	writePolicy(t, dir, strings.Replace(testPolicy, "limit: 3", "limit: 5", 1))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		_, body := get(t, base+"/readyz")
		return strings.Contains(body, "reloads: 2 ok, 0 failed")
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 5, admitted(t, base, "b", 7), "the reloaded limit of 5")

	writePolicy(t, dir, "version: 1\nrules: [")
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		_, body := get(t, base+"/readyz")
		return strings.Contains(body, "reloads: 2 ok, 1 failed")
	}, 10*time.Second, 20*time.Millisecond)
	code, body = get(t, base+"/readyz")
	assert.Equal(t, http.StatusOK, code, "the previous policy stays in force: still ready")
	assert.Contains(t, body, "last reload failed")
	assert.Contains(t, body, "policy.yaml:2", "the error names the line")
	_, metrics := get(t, base+"/metrics")
	assert.Regexp(t, `hybridrate_policy_reloads_total\{[^}]*result="error"[^}]*\} 1\n`, metrics)
	assert.Regexp(t, `hybridrate_policy_reloads_total\{[^}]*result="ok"[^}]*\} 2\n`, metrics)
	assert.Regexp(t, `hybridrate_policy_reload_failing\{[^}]*\} 1\n`, metrics)
	assert.Equal(t, 5, admitted(t, base, "c", 7), "limit 5 stays")

	// SIGTERM: unready at once, still serving during the grace period, then a clean exit.
	sent := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool {
		code, body := get(t, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not ready: shutting down")
	}, time.Second, 10*time.Millisecond)
	assert.Equal(t, http.StatusOK, post(t, base, "d"), "served during the grace period")
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status 0")
	case <-time.After(15 * time.Second):
		t.Fatal("no exit within 15s of SIGTERM")
	}
	assert.GreaterOrEqual(t, time.Since(sent), 1500*time.Millisecond, "the grace period was kept")

	// Every line is JSON, debug lines included; the shutdown flushed.
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	levels := map[string]int{}
	for _, l := range lines {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec), "not JSON: %s", l)
		levels[rec["level"].(string)]++
	}
	assert.Positive(t, levels["INFO"])
	assert.Positive(t, levels["ERROR"], "the rejected policy")
	assert.Contains(t, stderr.String(), "pending consumption flushed to Redis")
	assert.Contains(t, stderr.String(), `"msg":"SIGHUP: reloading the policy file"`)
}

func TestLogLevelAndFormat(t *testing.T) {
	none := func(string) string { return "" }
	c, err := parseConfig([]string{"-log-level", "warn", "-log-format", "json"}, none, io.Discard)
	require.NoError(t, err)
	var buf bytes.Buffer
	log := newLogger(c, &buf)
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec), buf.String())
	assert.Equal(t, "shown", rec["msg"])
	assert.Equal(t, "WARN", rec["level"])
	assert.NotContains(t, buf.String(), "hidden")

	c, err = parseConfig(nil, func(k string) string { return map[string]string{"HYBRIDRATED_LOG_LEVEL": "error"}[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, slog.LevelError, c.logLevel)
	assert.False(t, c.logJSON)
	_, err = parseConfig([]string{"-log-level", "loud"}, none, io.Discard)
	assert.ErrorContains(t, err, "want debug, info, warn or error")
	_, err = parseConfig([]string{"-log-format", "xml"}, none, io.Discard)
	assert.ErrorContains(t, err, "want text or json")
	_, err = parseConfig([]string{"-shutdown-grace", "-1s"}, none, io.Discard)
	assert.Error(t, err)
	c, err = parseConfig(nil, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, c.shutdownGrace, "the default grace")
}

// TestRedisACLUser: the sidecar connects as the -redis-user ACL user, with the password from the
// environment; the default user here may not run scripts at all (issue 23).
func TestRedisACLUser(t *testing.T) {
	srv := redistest.Start(t, "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-@scripting",
		"--user", "limiter", "on", ">s3cret", "~*", "&*", "+@all")
	path := writePolicy(t, t.TempDir(), strictPolicy)
	env := map[string]string{"HYBRIDRATED_REDIS_USER": "limiter", "HYBRIDRATED_REDIS_PASSWORD": "s3cret"}
	cfg, err := parseConfig([]string{"-redis", srv.Addr, "-policy", path}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "limiter", cfg.redisUser)
	cfg.shutdownGrace = 0
	a, stop := start(t, cfg)
	assert.Equal(t, []int{200, 200, 200, 429}, codes(t, "http://"+a.http, "acl", 4), "decided by the strict script")
	list, _ := srv.Do(t, "CLIENT", "LIST").(string)
	assert.Contains(t, list, "user=limiter")
	aclLog, _ := srv.Do(t, "ACL", "LOG").([]any)
	assert.Empty(t, aclLog, "no command was refused")
	require.NoError(t, stop())
}

// strictPolicy decides in Redis at every request: a script a user without @scripting cannot run.
const strictPolicy = `
version: 1
missing_key: skip
rules:
  - {id: per-key, algorithm: fixed_window, dimensions: [api_key], limit: 3, period: 1h, on_failure: fail_closed}
`

func codes(t *testing.T, base, key string, n int) []int {
	t.Helper()
	var out []int
	for i := 0; i < n; i++ {
		out = append(out, post(t, base, key))
	}
	return out
}

// TestRedisTLS: the sidecar reaches a Redis that listens only on TLS for it (-redis-tls-ca,
// -redis-tls-server-name), the CA verified (issue 23).
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := selfSigned(t, dir)
	serverCert(t, dir, ca, caKey)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tlsPort := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	srv := redistest.Start(t, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", filepath.Join(dir, "server.pem"),
		"--tls-key-file", filepath.Join(dir, "server-key.pem"), "--tls-ca-cert-file", filepath.Join(dir, "ca.pem"),
		"--tls-auth-clients", "no")
	path := writePolicy(t, t.TempDir(), strictPolicy)
	addr := "127.0.0.1:" + strconv.Itoa(tlsPort)
	env := map[string]string{"HYBRIDRATED_REDIS_TLS": "true", "HYBRIDRATED_REDIS_TLS_CA": filepath.Join(dir, "ca.pem")}
	cfg, err := parseConfig([]string{"-redis", addr, "-policy", path, "-redis-tls-server-name", "redis.test"},
		func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	cfg.shutdownGrace = 0
	cfg.checkTimeout = 2 * time.Second // a TLS handshake under -race on a loaded machine
	a, stop := start(t, cfg)
	assert.Equal(t, []int{200, 200, 200, 429}, codes(t, "http://"+a.http, "tls", 4), "decided by the strict script, over TLS")
	keys, _ := srv.Do(t, "KEYS", "*per-key*").([]any)
	assert.NotEmpty(t, keys, "the counters are in the Redis behind the TLS port")
	require.NoError(t, stop())

	// Without the CA the certificate is not trusted: fail closed, nothing written.
	cfg.redisTLSCA = ""
	a, stop = start(t, cfg)
	assert.Equal(t, http.StatusTooManyRequests, post(t, "http://"+a.http, "untrusted"), "fail_closed: no decision")
	require.NoError(t, stop())
	_, err = parseConfig([]string{"-redis-tls-cert", "c.pem"}, func(string) string { return "" }, io.Discard)
	assert.ErrorContains(t, err, "go together")
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}

func selfSigned(t *testing.T, dir string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", der)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return ca, key
}

func serverCert(t *testing.T, dir string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis.test"},
		DNSNames: []string{"redis.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	writePEM(t, filepath.Join(dir, "server.pem"), "CERTIFICATE", der)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	writePEM(t, filepath.Join(dir, "server-key.pem"), "EC PRIVATE KEY", kder)
}
