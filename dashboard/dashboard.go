package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/hybridrate/hybridrate/observe"
)

//go:embed static
var static embed.FS

// Source is what the dashboard draws from: an *observe.Observer. It is called from the handler's
// goroutines, one per request, concurrently: it must be safe for concurrent use.
type Source interface {
	Snapshot(span time.Duration) observe.Snapshot
}

// FleetSource is what the fleet view draws from: an *observe.Fleet. It is called from the handler's
// goroutines concurrently: it must be safe for concurrent use.
type FleetSource interface {
	View(ctx context.Context) (observe.FleetView, error)
}

// Option configures a [Handler]; see the With functions. It has the shape of every package's Option
// (an interface with an unexported method), but none of the dashboard's options can fail, so Handler
// returns no error. Options are immutable values, safe to share.
type Option interface{ apply(*handler) }

type optionFunc func(*handler)

func (f optionFunc) apply(h *handler) { f(h) }

type handler struct{ fleet FleetSource }

// WithFleet adds the fleet view: every live instance's counters, read from Redis through f, at
// "/api/fleet", and the page's Fleet section. Without it (or with a nil f) the page shows this
// instance only.
func WithFleet(f FleetSource) Option { return optionFunc(func(h *handler) { h.fleet = f }) }

// DefaultSpan is the span the page shows unless asked otherwise (?span=seconds).
const DefaultSpan = 5 * time.Minute

// Handler returns the dashboard: the page at "/" (index.html, app.js, style.css) and the data at
// "/api/snapshot" (?span=seconds, default 300) and, with [WithFleet], "/api/fleet" (404 without
// it). Mount it under a prefix with http.StripPrefix. Nil options are ignored. The handler is safe
// for concurrent use; each request reads src (and the fleet source) once, and does no other I/O.
func Handler(src Source, opts ...Option) http.Handler {
	var h handler
	for _, o := range opts {
		if o != nil {
			o.apply(&h)
		}
	}
	sub, _ := fs.Sub(static, "static") // cannot fail: a fixed, valid directory of the embedded tree
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(sub))
	mux.HandleFunc("GET /api/snapshot", func(w http.ResponseWriter, r *http.Request) {
		span := DefaultSpan
		if v := r.URL.Query().Get("span"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 86400 {
				http.Error(w, "span: want whole seconds from 1 to 86400", http.StatusBadRequest)
				return
			}
			span = time.Duration(n) * time.Second
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(src.Snapshot(span))
	})
	mux.HandleFunc("GET /api/fleet", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if h.fleet == nil {
			http.Error(w, "no fleet view: this instance publishes no report", http.StatusNotFound)
			return
		}
		v, err := h.fleet.View(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	})
	return mux
}
