package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/dashboard"
	"github.com/hybridrate/hybridrate/observe"
)

type fixed struct{ span time.Duration }

func (f *fixed) Snapshot(span time.Duration) observe.Snapshot {
	f.span = span
	return observe.Snapshot{Instance: "pod-1", Sum: observe.Second{Denied: 7},
		Denied: []observe.DenyCount{{Route: "GET /x", Rule: "r", Tier: "free", N: 7, Rate: 0.1}}}
}

func TestHandlerServesPageAndSnapshot(t *testing.T) {
	src := &fixed{}
	srv := httptest.NewServer(http.StripPrefix("/rl", dashboard.Handler(src)))
	defer srv.Close()
	for path, want := range map[string]string{
		"/rl/":          `<svg id="chart"`,
		"/rl/app.js":    "api/snapshot",
		"/rl/style.css": "#chart",
	} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Contains(t, string(b), want, path)
	}
	resp, err := http.Get(srv.URL + "/rl/api/snapshot?span=60")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	var s observe.Snapshot
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	assert.Equal(t, "pod-1", s.Instance)
	assert.EqualValues(t, 7, s.Sum.Denied)
	assert.Equal(t, time.Minute, src.span)

	resp2, err := http.Get(srv.URL + "/rl/api/snapshot?span=-3")
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp2.StatusCode)
}

type fleetView struct{ err error }

func (f fleetView) View(context.Context) (observe.FleetView, error) {
	return observe.FleetView{Self: "pod-1-ab", Instances: []observe.FleetMember{{Report: observe.Report{ID: "pod-1-ab", Instance: "pod-1"}}}}, f.err
}

func TestHandlerServesTheFleetWhenGiven(t *testing.T) {
	status := func(h http.Handler) (int, string) {
		srv := httptest.NewServer(h)
		defer srv.Close()
		resp, err := http.Get(srv.URL + "/api/fleet")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, _ := status(dashboard.Handler(&fixed{}))
	assert.Equal(t, http.StatusNotFound, code, "no fleet: the page hides its Fleet section")
	code, body := status(dashboard.Handler(&fixed{}, dashboard.WithFleet(fleetView{})))
	assert.Equal(t, http.StatusOK, code)
	var v observe.FleetView
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	assert.Equal(t, "pod-1-ab", v.Self)
	require.Len(t, v.Instances, 1)
	assert.Equal(t, "pod-1", v.Instances[0].Instance)
	code, body = status(dashboard.Handler(&fixed{}, dashboard.WithFleet(fleetView{err: errors.New("redis down")})))
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, body, "redis down")
}
