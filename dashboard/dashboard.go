package dashboard

import (
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

// Source is what the dashboard draws from: an *observe.Observer.
type Source interface {
	Snapshot(span time.Duration) observe.Snapshot
}

// DefaultSpan is the span the page shows unless asked otherwise (?span=seconds).
const DefaultSpan = 5 * time.Minute

// Handler returns the dashboard: the page at "/" (index.html, app.js, style.css) and the data at
// "/api/snapshot" (?span=seconds, default 300). Mount it under a prefix with http.StripPrefix.
func Handler(src Source) http.Handler {
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
	return mux
}
