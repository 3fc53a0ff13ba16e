package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/hybridrate/hybridrate/central"
)

// Path is where Handler serves and Remote calls: POST, the binary messages of wire.go.
const Path = "/hybridrate/relay/v1"

// maxBody bounds a request's body: a full batch of the longest keys.
const maxBody = maxWireKeys*(updateFixed+maxWireKeyLen) + 512

// maxSafe is the largest integer a float64 holds exactly (reconcile.lua's counters are doubles).
const maxSafe = 1<<53 - 1

// valid checks what a child sent before the relay applies it: what reaches the relay over the
// network is not trusted to come from package hybrid.
func valid(node string, u central.Update) error {
	switch {
	case len(node) == 0 || len(node) > 255:
		return fmt.Errorf("%w: node id of %d bytes", central.ErrInvalid, len(node))
	case len(u.Key) == 0 || len(u.Key) > maxWireKeyLen:
		return fmt.Errorf("%w: key of %d bytes", central.ErrInvalid, len(u.Key))
	case !u.Limit.Valid():
		return fmt.Errorf("%w: limit rate=%v burst=%d", central.ErrInvalid, u.Limit.Rate, u.Limit.Burst)
	case u.Inc > maxSafe || u.Cum < 0 || u.Cum > maxSafe || u.Acked < 0 || u.Acked > maxSafe ||
		u.Used < 0 || u.Used > maxSafe || u.UAcked < 0 || u.UAcked > maxSafe:
		return fmt.Errorf("%w: counters out of range", central.ErrInvalid)
	case !(u.Demand >= 0 && u.Demand <= 1e9) || u.Want < 0 || u.Want > 1e9:
		return fmt.Errorf("%w: demand %v, want %d", central.ErrInvalid, u.Demand, u.Want)
	case u.N < 0 || u.N > u.Limit.Burst || (u.Inc == 0 && u.N == 0):
		return fmt.Errorf("%w: n=%d", central.ErrInvalid, u.N)
	}
	return nil
}

// Handler serves the relay to remote children (Remote) at Path. A malformed request gets 400 with
// the reason; a key the relay refuses is answered as such in the response, the other keys of the
// call are unaffected.
func (r *Relay) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "relay: POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, maxBody+1))
		if err != nil {
			http.Error(w, "relay: reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > maxBody {
			http.Error(w, "relay: request too large", http.StatusRequestEntityTooLarge)
			return
		}
		node, updates, err := parseRequest(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out := make([]central.State, len(updates))
		errs := make([]error, len(updates))
		if err := r.Reconcile(req.Context(), node, updates, out, errs); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(appendResponse(nil, out, errs))
	})
}

// Remote is a relay reached over HTTP (its Handler): a hybrid.Upstream for the limiters of other
// processes. Create it with Dial; it is safe for concurrent use.
type Remote struct {
	url string
	hc  *http.Client
	buf sync.Pool
}

// Dial returns a Remote for the relay served at base (e.g. "http://127.0.0.1:8090"); hc nil means
// http.DefaultClient. It connects on first use.
func Dial(base string, hc *http.Client) *Remote {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Remote{url: base + Path, hc: hc, buf: sync.Pool{New: func() any { return new([]byte) }}}
}

// ErrRemote is wrapped by the errors of a call the relay did not answer (transport, HTTP status).
var ErrRemote = errors.New("relay: remote call failed")

// Reconcile sends a node's updates to the relay (hybrid.Upstream). It makes one HTTP round trip.
// Errors: out or errs shorter than updates; [ErrRemote] (wrapped) when the relay did not answer;
// each update's own failure is in errs[i] (a [*RemoteError]).
func (m *Remote) Reconcile(ctx context.Context, node string, updates []central.Update, out []central.State, errs []error) error {
	if len(out) < len(updates) || len(errs) < len(updates) {
		return fmt.Errorf("relay: %d updates, room for %d answers", len(updates), min(len(out), len(errs)))
	}
	bp := m.buf.Get().(*[]byte)
	defer m.buf.Put(bp)
	body, err := appendRequest((*bp)[:0], node, updates)
	*bp = body
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRemote, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := m.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRemote, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(3+len(updates)*(stateFixed+1030))))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRemote, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: HTTP %d: %s", ErrRemote, resp.StatusCode, bytes.TrimSpace(data[:min(len(data), 200)]))
	}
	return parseResponse(data, out[:len(updates)], errs[:len(updates)])
}

// Take sends one synchronous call to the relay (hybrid.Upstream). It makes one HTTP round trip.
// Errors: Reconcile's, and the update's own (a [*RemoteError]).
func (m *Remote) Take(ctx context.Context, node string, u central.Update) (central.State, error) {
	var out [1]central.State
	var errs [1]error
	if err := m.Reconcile(ctx, node, []central.Update{u}, out[:], errs[:]); err != nil {
		return central.State{}, err
	}
	return out[0], errs[0]
}
