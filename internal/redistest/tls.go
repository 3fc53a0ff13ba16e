package redistest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TLSServer is a standalone redis-server started by [StartTLS] that accepts
// TLS connections only (its plain-text port is disabled). It is killed in the
// cleanup of the test that started it. It offers no fault injection; use
// [Start] for that.
type TLSServer struct {
	// Addr is the TLS address, "127.0.0.1:PORT".
	Addr string
	// Port is the TLS port.
	Port int
	// CAFile, CertFile and KeyFile are the PEM files of the test certificate
	// authority and of the server's certificate and key, in the server's
	// temporary directory.
	CAFile, CertFile, KeyFile string

	roots    *x509.CertPool // the test CA
	password string         // value of --requirepass in the extra args, if any
	dir      string
	logPath  string
	proc     *process
}

// StartTLS starts a standalone redis-server that serves TLS only ("--port 0
// --tls-port P") on a free loopback port, with the same settings as [Start]
// (no persistence, working directory and log in tb.TempDir()). It first
// creates a throwaway certificate authority and a server certificate for
// 127.0.0.1 and localhost (ECDSA P-256, valid for a day), written as PEM
// files into that directory. Clients are not asked for certificates
// (--tls-auth-clients no). Extra args are appended to the command line;
// "--requirepass" is honoured by [TLSServer.Do] as with Start.
//
// StartTLS returns once the server answers INFO over TLS with its own PID
// (within 10s), retrying on another port if the chosen one is taken, and
// registers a cleanup that kills the server. Like [Start], it skips the test
// when redis-server is missing (fails it under CI=true); a redis-server built
// without TLS support fails the test with its log.
func StartTLS(tb testing.TB, args ...string) *TLSServer {
	tb.Helper()
	bin := Binary(tb)
	s := &TLSServer{dir: tb.TempDir()}
	s.logPath = filepath.Join(s.dir, "redis.log")
	for i := 0; i+1 < len(args); i++ {
		if strings.EqualFold(args[i], "--requirepass") {
			s.password = args[i+1]
		}
	}
	if err := s.writeCerts(); err != nil {
		tb.Fatalf("redistest: TLS certificates: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.stop(); err != nil {
			tb.Errorf("redistest: cleanup of %s: %v", s.Addr, err)
		}
		releasePort(s.Port)
		if tb.Failed() && s.Port != 0 {
			tb.Logf("redistest: log of TLS redis-server %s (%s):\n%s", s.Addr, s.dir, tailFile(s.logPath, 10))
		}
	})
	var err error
	for range startAttempts {
		releasePort(s.Port)
		if s.Port, err = pickPort(); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		if err = s.launch(bin, args); !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		tb.Fatalf("redistest: start TLS redis-server on %s: %v\nlog tail (%s):\n%s", s.Addr, err, s.logPath, tailFile(s.logPath, logTailLines))
	}
	return s
}

// ClientTLSConfig returns a TLS configuration that trusts the test CA, for
// redis.Options.TLSConfig (for example after redis.ParseURL of
// [TLSServer.URL]). Each call returns a new value the caller may modify.
func (s *TLSServer) ClientTLSConfig() *tls.Config {
	return &tls.Config{RootCAs: s.roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// URL returns "rediss://127.0.0.1:PORT", for redis.ParseURL.
func (s *TLSServer) URL() string { return "rediss://" + s.Addr }

// Do sends one command over a new TLS connection (authenticated if the
// server has a password) and returns the reply like [Server.Do]; an error
// reply, a network error or no reply within 5s fails the test.
func (s *TLSServer) Do(tb testing.TB, args ...any) any {
	tb.Helper()
	return do(tb, s.Addr+" (TLS)", s.command, args)
}

// command is Do without a testing.TB.
func (s *TLSServer) command(ctx context.Context, args ...any) (any, error) {
	return command(ctx, s.Addr, s.password, s.ClientTLSConfig(), args...)
}

// launch starts the process and waits until it answers over TLS.
func (s *TLSServer) launch(bin string, extra []string) error {
	argv := append([]string{
		"--port", "0",
		"--tls-port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", s.logPath,
		"--save", "",
		"--appendonly", "no",
		"--tls-cert-file", s.CertFile,
		"--tls-key-file", s.KeyFile,
		"--tls-ca-cert-file", s.CAFile,
		"--tls-auth-clients", "no",
	}, extra...)
	p, logStart, err := startProcess(bin, s.dir, s.logPath, argv)
	if err != nil {
		return err
	}
	s.proc = p
	if err := waitReady(p, s.Port, " over TLS", s.command); err != nil {
		if stopErr := s.stop(); stopErr != nil {
			return errors.Join(err, stopErr)
		}
		if strings.Contains(readFrom(s.logPath, logStart), "Address already in use") {
			return fmt.Errorf("%w: %v", errAddrInUse, err)
		}
		return err
	}
	return nil
}

// stop kills the process group, if running, and waits until it is reaped.
func (s *TLSServer) stop() error {
	if err := stopProcess(s.proc, false); err != nil {
		return err
	}
	s.proc = nil
	return nil
}

// writeCerts creates the test CA and the server certificate and writes them
// as PEM files into the server's directory.
func (s *TLSServer) writeCerts() error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "redistest server"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	s.CAFile = filepath.Join(s.dir, "ca.pem")
	s.CertFile = filepath.Join(s.dir, "server.pem")
	s.KeyFile = filepath.Join(s.dir, "server.key")
	for _, f := range []struct {
		path, kind string
		der        []byte
		mode       os.FileMode
	}{
		{s.CAFile, "CERTIFICATE", caDER, 0o644},
		{s.CertFile, "CERTIFICATE", der, 0o644},
		{s.KeyFile, "PRIVATE KEY", keyDER, 0o600},
	} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), f.mode); err != nil {
			return err
		}
	}
	s.roots = x509.NewCertPool()
	s.roots.AddCert(ca)
	return nil
}

// tailFile returns the last n lines of the file at path.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// readFrom returns up to 1 MiB of the file at path from offset off.
func readFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:min(int64(len(b)), off+1<<20)])
}
