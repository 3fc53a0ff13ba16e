package hybrid

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/internal/redisx"
)

// bgLog writes the limiter's background log: state changes of the circuit breakers as they happen,
// and failures of the background work (reconcile rounds, ban-list loads) as at most one summary
// line per kind and logSummaryEvery, so that an outage costs a handful of lines, not one per flush.
// Safe for concurrent use.
type bgLog struct {
	logger *slog.Logger
	every  time.Duration
	now    func() time.Time // the wall clock; never WithClock's

	reconcile, bans failureSummary
}

// failureSummary counts one kind of failure between two summary lines.
type failureSummary struct {
	what string // "reconcile", "ban list"
	hint string // what the failure means for the caller

	mu       sync.Mutex // guards the fields below
	n        int64      // failures since the last line
	last     error      // the latest of them, other than ErrUnavailable if there is one
	reported time.Time  // when the last line was written; zero before the first
}

func newBGLog(logger *slog.Logger, every time.Duration) *bgLog {
	return &bgLog{
		logger:    logger,
		every:     every,
		now:       time.Now,
		reconcile: failureSummary{what: "reconcile", hint: "consumption stays pending"},
		bans:      failureSummary{what: "ban list", hint: "bans are enforced from this node's copy"},
	}
}

// failed counts err and logs a summary if none was logged for this kind in the last l.every.
func (l *bgLog) failed(s *failureSummary, err error) {
	now := l.now()
	s.mu.Lock()
	s.n++
	if s.last == nil || !errors.Is(err, central.ErrUnavailable) {
		s.last = err // "breaker open" says less than the failure that opened it
	}
	err = s.last
	if !s.reported.IsZero() && now.Sub(s.reported) < l.every {
		s.mu.Unlock()
		return
	}
	n, since := s.n, now.Sub(s.reported)
	if s.reported.IsZero() {
		since = 0
	}
	s.n, s.reported = 0, now
	s.mu.Unlock()
	l.logger.LogAttrs(context.Background(), slog.LevelWarn, "hybridrate: "+s.what+" failing; "+s.hint,
		slog.Int64("failures", n), slog.Duration("since_last_report", since.Round(time.Millisecond)),
		slog.Any("last_error", err), slog.String("class", redisx.Class(err).String()))
}

// take returns and resets the failures not reported yet.
func (s *failureSummary) take() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, last := s.n, s.last
	s.n, s.last = 0, nil
	return n, last
}

// breaker logs the circuit breaker's changes: opened (with the failure that opened it) and closed.
// The open ↔ half-open changes of the probes in between are not logged.
func (l *bgLog) breaker(ev redisx.BreakerEvent) {
	switch {
	case ev.From == redisx.BreakerClosed && ev.To == redisx.BreakerOpen:
		l.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"hybridrate: Redis unavailable, circuit breaker opened; the failure policy decides what needs Redis",
			slog.Int("consecutive_failures", ev.Failures), slog.Any("last_error", ev.Err),
			slog.String("class", redisx.Class(ev.Err).String()))
	case ev.To == redisx.BreakerClosed:
		n, last := l.reconcile.take()
		attrs := []slog.Attr{slog.Int64("unreported_reconcile_failures", n)}
		if last != nil {
			attrs = append(attrs, slog.Any("last_error", last))
		}
		l.logger.LogAttrs(context.Background(), slog.LevelInfo, "hybridrate: Redis available again, circuit breaker closed", attrs...)
	}
}

// checkBreaker logs the changes of the breaker of synchronous checks (central.Client.CheckBreaker):
// opened, when checks keep timing out at the check timeout (Redis slower than it, or unreachable:
// go-redis retries a refused dial for longer than a check waits), and closed. The probes in between
// are not logged.
func (l *bgLog) checkBreaker(ev redisx.BreakerEvent) {
	switch {
	case ev.From == redisx.BreakerClosed && ev.To == redisx.BreakerOpen:
		l.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"hybridrate: synchronous checks time out (Redis slower than the check timeout, or unreachable), checks suspended; the failure policy decides what needs Redis, background reconciles go on",
			slog.Int("consecutive_timeouts", ev.Failures), slog.Any("last_error", ev.Err))
	case ev.To == redisx.BreakerClosed:
		l.logger.LogAttrs(context.Background(), slog.LevelInfo, "hybridrate: synchronous checks answered in time again, checks resumed")
	}
}
