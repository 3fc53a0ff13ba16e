package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// sentinelMasterName is the name the sentinels monitor the master under.
	sentinelMasterName = "mymaster"
	// sentinelReadyTimeout bounds the wait for the sentinels to see everything.
	sentinelReadyTimeout = 30 * time.Second
	// failoverTimeout bounds Failover.
	failoverTimeout = 30 * time.Second
)

// Sentinel is a Redis Sentinel setup started by [StartSentinel]: a master,
// one replica and three sentinels. Its processes are killed in the cleanup
// of the test that started it.
//
// Most callers want [Sentinel.Client]. [Sentinel.Failover] kills the master
// and waits for the sentinels to promote the replica; [Sentinel.Master]
// returns the current master for finer-grained faults.
//
// The zero Sentinel is not usable. A Sentinel is safe for concurrent use,
// but its methods fail the test through tb, so call them from the test's
// goroutine.
type Sentinel struct {
	// MasterName is the name the sentinels monitor the master under.
	MasterName string
	// SentinelAddrs holds the addresses of the three sentinels.
	SentinelAddrs []string

	data      []*Server // the initial master and replica
	sentinels []*Server
}

// StartSentinel starts a master, one replica of it, and three sentinels
// monitoring the master with quorum 2, down-after-milliseconds 1000 and
// failover-timeout 3000. It returns once every sentinel sees the master, the
// linked replica and the two other sentinels.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	master := Start(tb)
	replica := Start(tb, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	s := &Sentinel{MasterName: sentinelMasterName, data: []*Server{master, replica}}

	conf := fmt.Sprintf(`sentinel monitor %[1]s 127.0.0.1 %[2]d 2
sentinel down-after-milliseconds %[1]s 1000
sentinel failover-timeout %[1]s 3000
sentinel parallel-syncs %[1]s 1
`, s.MasterName, master.Port)
	for range 3 {
		sn := newServer(tb, nil)
		// Sentinel rewrites its configuration file, so each gets its own.
		sn.conf = filepath.Join(sn.dir, "sentinel.conf")
		if err := os.WriteFile(sn.conf, []byte(conf), 0o644); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		sn.startFresh(tb)
		s.sentinels = append(s.sentinels, sn)
		s.SentinelAddrs = append(s.SentinelAddrs, sn.Addr)
	}

	deadline := time.Now().Add(sentinelReadyTimeout)
	for {
		err := s.checkReady()
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: sentinels not ready after %v: %v", sentinelReadyTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// checkReady returns nil once every sentinel sees the master up, a replica
// linked to it, and the two other sentinels.
func (s *Sentinel) checkReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, sn := range s.sentinels {
		v, err := sn.command(ctx, "SENTINEL", "MASTER", s.MasterName)
		if err != nil {
			return fmt.Errorf("%s: SENTINEL MASTER: %w", sn.Addr, err)
		}
		m := pairs(v)
		if m["flags"] != "master" {
			return fmt.Errorf("%s: master flags %q", sn.Addr, m["flags"])
		}
		if m["num-other-sentinels"] != "2" {
			return fmt.Errorf("%s: sees %s other sentinels", sn.Addr, m["num-other-sentinels"])
		}
		v, err = sn.command(ctx, "SENTINEL", "REPLICAS", s.MasterName)
		if err != nil {
			return fmt.Errorf("%s: SENTINEL REPLICAS: %w", sn.Addr, err)
		}
		list, _ := v.([]any)
		linked := false
		for _, r := range list {
			r := pairs(r)
			if r["flags"] == "slave" && r["master-link-status"] == "ok" {
				linked = true
			}
		}
		if !linked {
			return fmt.Errorf("%s: sees no linked replica", sn.Addr)
		}
	}
	return nil
}

// Master returns the current master according to the first live sentinel
// (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinel) Master(tb testing.TB) *Server {
	tb.Helper()
	var errs []error
	for _, sn := range s.sentinels {
		if !sn.live() {
			continue
		}
		m, err := s.masterPerSentinel(sn)
		if err == nil {
			return m
		}
		errs = append(errs, fmt.Errorf("%s: %w", sn.Addr, err))
	}
	tb.Fatalf("redistest: no sentinel names a master: %v", errors.Join(errs...))
	return nil
}

func (s *Sentinel) masterPerSentinel(sn *Server) (*Server, error) {
	v, err := sn.command(context.Background(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
	if err != nil {
		return nil, err
	}
	addr, ok := v.([]any)
	if !ok || len(addr) != 2 {
		return nil, fmt.Errorf("unexpected reply %#v", v)
	}
	port, _ := addr[1].(string)
	for _, d := range s.data {
		if strconv.Itoa(d.Port) == port {
			return d, nil
		}
	}
	return nil, fmt.Errorf("master %v:%v is not one of ours", addr[0], addr[1])
}

// Client returns a go-redis failover client (redis.NewFailoverClient) that
// finds the master through the sentinels. It is closed in tb.Cleanup.
func (s *Sentinel) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    s.MasterName,
		SentinelAddrs: slices.Clone(s.SentinelAddrs),
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Failover kills the current master and waits, for at most 30s, until
// every live sentinel names the same new master and that server answers
// ROLE as a master. That takes about 2-3s with the settings of
// [StartSentinel].
//
// With a single replica, a second Failover needs a new replica first: for
// example, Restart the killed master and the sentinels will turn it into a
// replica of the new one.
func (s *Sentinel) Failover(tb testing.TB) {
	tb.Helper()
	old := s.Master(tb)
	old.Kill(tb)
	deadline := time.Now().Add(failoverTimeout)
	for {
		err := s.checkFailedOver(old)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: no failover from %s within %v: %v", old.Addr, failoverTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

func (s *Sentinel) checkFailedOver(old *Server) error {
	var master *Server
	for _, sn := range s.sentinels {
		if !sn.live() {
			continue
		}
		m, err := s.masterPerSentinel(sn)
		if err != nil {
			return fmt.Errorf("%s: %w", sn.Addr, err)
		}
		if m == old {
			return fmt.Errorf("%s still names %s", sn.Addr, old.Addr)
		}
		if master != nil && m != master {
			return fmt.Errorf("sentinels disagree: %s vs %s", master.Addr, m.Addr)
		}
		master = m
	}
	if master == nil {
		return errors.New("no live sentinel")
	}
	v, err := master.command(context.Background(), "ROLE")
	if err != nil {
		return fmt.Errorf("%s: ROLE: %w", master.Addr, err)
	}
	if role, _ := v.([]any); len(role) == 0 || role[0] != "master" {
		return fmt.Errorf("%s: ROLE is %v", master.Addr, v)
	}
	return nil
}

// pairs turns a flat [k1, v1, k2, v2, ...] reply into a map, keeping only
// string values.
func pairs(v any) map[string]string {
	m := make(map[string]string)
	list, _ := v.([]any)
	for i := 0; i+1 < len(list); i += 2 {
		k, _ := list[i].(string)
		val, _ := list[i+1].(string)
		m[k] = val
	}
	return m
}
