package sync

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/local"
)

// port is the part of *central.Client the syncer uses.
type port interface {
	Reconcile(ctx context.Context, updates []central.Update, out []central.State, errs []error) error
}

var _ port = (*central.Client)(nil)

// Config configures a [Syncer]. Every field is required unless it says otherwise.
type Config struct {
	// Store is the local state to reconcile.
	Store *local.Store
	// Central sends the batches; *central.Client satisfies it.
	Central port
	// Interval is the wait between the first pending consumption and its flush.
	Interval time.Duration
	// MaxBatch is the largest number of keys handed to Central in one call.
	MaxBatch int
	// Drift is the fraction of the projected global tokens (global + rate·Interval) that this node's
	// share of may be consumed locally; 0 to 1.
	Drift float64
	// OnState, if not nil, is called after an entry's answer was applied. It must not block.
	OnState func(e *local.Entry, st central.State)
	// OnError, if not nil, receives flush errors. It must not block.
	OnError func(error)
	// Now returns the time on a monotonic clock, in nanoseconds; it stamps each answer applied to an
	// entry (local.Entry.GrantedAt).
	Now func() int64
	// Round returns a number in [0, 1) that rounds allowances (see local.Allowance); nil means
	// uniformly random (math/rand/v2). Tests pin it.
	Round func() float64
}

// Stats counts the syncer's work. All fields only grow, except LastFlushMicros.
type Stats struct {
	Flushes         atomic.Int64 // flushes that had something to send
	Keys            atomic.Int64 // keys sent
	FailedKeys      atomic.Int64 // keys whose reconcile failed and stay pending
	FlushMicros     atomic.Int64 // total flush time in µs
	LastFlushMicros atomic.Int64 // duration of the last flush in µs
}

// Syncer reconciles a local store with Redis. Create it with [New]; it is safe for concurrent use.
type Syncer struct {
	cfg   Config
	stats Stats

	mu      sync.Mutex // serialises flushes; guards the buffers below
	entries []*local.Entry
	updates []central.Update
	states  []central.State
	errs    []error
}

// New validates cfg and returns a syncer. It starts nothing.
func New(cfg Config) (*Syncer, error) {
	switch {
	case cfg.Store == nil || cfg.Central == nil:
		return nil, errors.New("ratesync: Store and Central are required")
	case cfg.Interval <= 0:
		return nil, errors.New("ratesync: Interval must be positive")
	case cfg.MaxBatch < 1:
		return nil, errors.New("ratesync: MaxBatch must be at least 1")
	case !(cfg.Drift >= 0 && cfg.Drift <= 1):
		return nil, errors.New("ratesync: Drift must be in [0, 1]")
	case cfg.Now == nil:
		return nil, errors.New("ratesync: Now is required")
	}
	return &Syncer{cfg: cfg}, nil
}

func (s *Syncer) round() float64 {
	if s.cfg.Round != nil {
		return s.cfg.Round()
	}
	return rand.Float64()
}

// Stats returns the syncer's counters.
func (s *Syncer) Stats() *Stats { return &s.stats }

// Run flushes pending consumption one Interval after it appears, until ctx ends. An idle store costs
// nothing: Run waits for the store's notification before it starts a timer.
func (s *Syncer) Run(ctx context.Context) {
	t := time.NewTimer(s.cfg.Interval)
	t.Stop()
	defer t.Stop()
	for {
		if s.cfg.Store.Dirty() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-s.cfg.Store.Notify():
			}
		}
		t.Reset(s.cfg.Interval)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.Flush(ctx); err != nil && s.cfg.OnError != nil && ctx.Err() == nil {
			s.cfg.OnError(err)
		}
	}
}

// Flush reconciles every dirty entry now. Entries whose reconcile fails become dirty again and are
// retried by the next flush; the first error is returned. Concurrent calls run one after another.
func (s *Syncer) Flush(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries = s.cfg.Store.Collect(s.entries[:0])
	if len(s.entries) == 0 {
		return nil
	}
	start := time.Now()
	s.stats.Flushes.Add(1)
	var first error
	for lo := 0; lo < len(s.entries); lo += s.cfg.MaxBatch {
		hi := min(lo+s.cfg.MaxBatch, len(s.entries))
		if err := s.flushBatch(ctx, s.entries[lo:hi]); err != nil && first == nil {
			first = err
		}
	}
	clear(s.entries) // drop references so evicted entries can be collected
	us := time.Since(start).Microseconds()
	s.stats.FlushMicros.Add(us)
	s.stats.LastFlushMicros.Store(us)
	return first
}

func (s *Syncer) flushBatch(ctx context.Context, batch []*local.Entry) error {
	n := len(batch)
	s.updates = s.updates[:0]
	for _, e := range batch {
		snap := e.Snapshot()
		rate, burst := e.Limit()
		s.updates = append(s.updates, central.Update{
			Key: e.Key(), Limit: central.Limit{Rate: rate, Burst: burst},
			Inc: snap.Inc, Cum: snap.Cum, Acked: snap.Acked,
		})
	}
	s.states = append(s.states[:0], make([]central.State, n)...)
	s.errs = append(s.errs[:0], make([]error, n)...)
	s.stats.Keys.Add(int64(n))
	err := s.cfg.Central.Reconcile(ctx, s.updates, s.states, s.errs)
	for i, e := range batch {
		if s.errs[i] != nil {
			s.stats.FailedKeys.Add(1)
			s.cfg.Store.MarkDirty(e) // keep it pending for the next round
			continue
		}
		s.Apply(e, s.updates[i].Limit, s.states[i], true)
	}
	clear(s.errs)
	return err
}

// Apply turns Redis's answer for e into e's new local allowance and reports it to OnState. A
// reconcile's answer (reconcile true) grants this node's share of the next interval's refill; a
// synchronous take's answer grants only the drift share of the bucket, so that frequent takes near
// the limit cannot claim the refill share again and again.
func (s *Syncer) Apply(e *local.Entry, lim central.Limit, st central.State, reconcile bool) {
	interval, u := 0.0, 0.0 // a take's answer rounds down: no share, no chance
	if reconcile {
		interval, u = s.cfg.Interval.Seconds(), s.round()
	}
	a := local.Allowance(s.cfg.Drift, float64(st.Tokens)/1e6, lim.Rate, interval, st.Active, u)
	e.Grant(st.Applied, a, st.Tokens, st.Active, st.ResetAfter.Microseconds(), s.cfg.Now())
	if s.cfg.OnState != nil {
		s.cfg.OnState(e, st)
	}
}
