// Package logtest records, in tests, what the code under test logs: through log/slog (give
// slog.New(rec) to a WithLogger option, then read the lines with [Recorder.Lines]), or as text
// written to an io.Writer, such as a child process's stderr ([Buffer]).
package logtest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Recorder is a slog.Handler that keeps every record, at every level. The zero Recorder is ready to
// use; it is safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	recs []slog.Record // guarded by mu
}

// Enabled reports true: a Recorder keeps every level.
func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns r: a Recorder keeps only the attributes given with each record.
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

// WithGroup returns r: a Recorder does not qualify attributes.
func (r *Recorder) WithGroup(string) slog.Handler { return r }

// Handle keeps a copy of rec.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// Len returns the number of records kept so far: a mark to pass to [Recorder.Lines].
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// Lines returns the records from index from on (every record for 0), each formatted as
// "LEVEL message k=v ...".
func (r *Recorder) Lines(from int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs[min(from, len(r.recs)):] {
		var b strings.Builder
		b.WriteString(rec.Level.String() + " " + rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.String())
			return true
		})
		out = append(out, b.String())
	}
	return out
}

// Buffer is an io.Writer that keeps what is written, for a log sink that one goroutine (or process)
// writes while the test reads it. The zero Buffer is empty and ready to use; it is safe for
// concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder // guarded by mu
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
