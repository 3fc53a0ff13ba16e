package relay_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/internal/redistest"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/relay"
)

// TestRemoteChildren: limiters reach their relay over HTTP (Handler, Dial); the key's limit holds
// as in process, and a bad update is refused for its key only.
func TestRemoteChildren(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const prefix = "rr1"
	r := newRelay(t, rdb, prefix, "relay-http")
	runRelays(t, r)
	hs := httptest.NewServer(r.Handler())
	t.Cleanup(hs.Close) // after the children's final flush
	remote := relay.Dial(hs.URL, hs.Client())
	// A check timeout that covers an HTTP round trip on a loaded test machine.
	kids := newChildren(t, rdb, prefix, "http-child", 4, []hybrid.Upstream{remote}, hybrid.WithCheckTimeout(100*time.Millisecond))
	limit := hybrid.Limit{Rate: 40, Burst: 20}
	var admitted, fallback atomic.Int64
	// 40 requests/s per child: four times the rate in all.
	el := drive(t, kids, 25*time.Millisecond, 1500*time.Millisecond, []string{"k"}, limit, func(_ int, d hybrid.Decision) {
		if d.Allowed {
			admitted.Add(1)
		}
		if d.Source == outcome.SourceFallback {
			fallback.Add(1)
		}
	})
	exact := float64(limit.Burst) + limit.Rate*el
	lendable := float64(limit.Burst) + limit.Rate*hybrid.LeaseAdvance.Seconds()
	got := float64(admitted.Load())
	t.Logf("admitted %v (fallback decisions %d), exact bucket %.0f over %.2fs", got, fallback.Load(), exact, el)
	if fallback.Load() > 0 {
		t.Errorf("%d decisions went to the failure policy: the relay over HTTP did not answer", fallback.Load())
	}
	if got > exact+lendable || got < 0.8*limit.Rate*el {
		t.Errorf("admitted %v, want from %.0f to %.0f", got, 0.8*limit.Rate*el, exact+lendable)
	}
	// A bad update (NaN rate) is refused for its key; the good one beside it is answered.
	var out [2]central.State
	var errs [2]error
	err := remote.Reconcile(context.Background(), "n1", []central.Update{
		{Key: "bad", Limit: central.Limit{Rate: math.NaN(), Burst: 5}, Inc: 1, Want: 1},
		{Key: "good", Limit: central.Limit{Rate: 5, Burst: 5}, Inc: 1, Demand: 1, Want: 1},
	}, out[:], errs[:])
	if err != nil {
		t.Fatal(err)
	}
	var re *relay.RemoteError
	if !errors.As(errs[0], &re) || errs[1] != nil || out[1].Status != central.StatusDone {
		t.Errorf("bad and good key: %v / %v %+v, want a RemoteError and an answer", errs[0], errs[1], out[1])
	}
}

// TestHandlerRefusesMalformed: the endpoint's answers to what is not a request.
func TestHandlerRefusesMalformed(t *testing.T) {
	srv := redistest.Start(t)
	r := newRelay(t, srv.Client(t), "rr2", "relay")
	hs := httptest.NewServer(r.Handler())
	defer hs.Close()
	for _, c := range []struct {
		method string
		body   []byte
		want   int
	}{
		{http.MethodGet, nil, http.StatusMethodNotAllowed},
		{http.MethodPost, []byte("hello"), http.StatusBadRequest},
		{http.MethodPost, []byte{1, 1, 'a', 5, 0}, http.StatusBadRequest}, // 5 updates announced, none sent
		{http.MethodPost, bytes.Repeat([]byte{1}, 5<<20), http.StatusRequestEntityTooLarge},
	} {
		req, _ := http.NewRequest(c.method, hs.URL+relay.Path, bytes.NewReader(c.body))
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %d bytes: HTTP %d, want %d", c.method, len(c.body), resp.StatusCode, c.want)
		}
	}
	// A relay that is not there: the error says so (a child's failure policy decides).
	if _, err := relay.Dial("http://127.0.0.1:1", nil).Take(context.Background(), "n", central.Update{Key: "k", Limit: lim, N: 1}); !errors.Is(err, relay.ErrRemote) {
		t.Errorf("no relay: %v, want ErrRemote", err)
	}
}
