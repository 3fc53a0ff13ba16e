package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// Plot geometry, in SVG user units.
const (
	plotW, plotH                       = 900, 460
	marginL, marginR, marginT, marginB = 80, 170, 50, 55
	innerW, innerH                     = plotW - marginL - marginR, plotH - marginT - marginB
	plotTicks                          = 5
)

var plotColors = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"}

// WriteSVG draws the admitted rate over time of every result (tokens per second, one line per mode,
// each from its own start), with the exact limit (Rate × active keys) as a dashed line.
func WriteSVG(w io.Writer, r Report) error {
	ew := &errWriter{w: w}
	var maxT time.Duration
	maxY := 0.0
	limitRate := 0.0
	series := make([][]float64, len(r.Results))
	for i, res := range r.Results {
		el := time.Duration(res.Elapsed)
		maxT = max(maxT, el)
		series[i] = res.Timeline.Rates(el)
		for _, v := range series[i] {
			maxY = max(maxY, v)
		}
		limitRate = max(limitRate, r.Scenario.Rate*float64(res.Accuracy.ActiveKeys))
	}
	maxY = max(maxY, limitRate)
	if maxY <= 0 {
		maxY = 1
	}
	yTop := niceCeil(maxY * 1.05)
	if maxT <= 0 {
		maxT = time.Second
	}
	xs := func(t time.Duration) float64 { return marginL + float64(innerW)*t.Seconds()/maxT.Seconds() }
	ys := func(v float64) float64 { return marginT + float64(innerH)*(1-v/yTop) }

	ew.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	ew.printf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	s := r.Scenario
	title := fmt.Sprintf("Admitted rate over time: %d nodes, %s, limit %s/s per key", s.Nodes, keysDesc(s), fmtNum(s.Rate))
	ew.printf(`<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", marginL, html.EscapeString(title))
	// Axes and grid: the y axis in fifths of its nice top, the x axis every nice step of seconds.
	for i := 0; i <= plotTicks; i++ {
		v := yTop * float64(i) / plotTicks
		y := ys(v)
		ew.printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/>`+"\n", marginL, y, marginL+innerW, y)
		ew.printf(`<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", marginL-6, y, html.EscapeString(fmtShort(v)))
	}
	step := niceCeil(maxT.Seconds() / plotTicks)
	for t := 0.0; t <= maxT.Seconds()+1e-9; t += step {
		x := xs(time.Duration(t * float64(time.Second)))
		ew.printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e5e5e5"/>`+"\n", x, marginT, x, marginT+innerH)
		ew.printf(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, marginT+innerH+18, trimFloat(t)+"s")
	}
	ew.printf(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", marginL, marginT, innerW, innerH)
	ew.printf(`<text x="%d" y="%d" text-anchor="middle">time since the mode started</text>`+"\n", marginL+innerW/2, plotH-12)
	ew.printf(`<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">admitted tokens/s (all nodes)</text>`+"\n", marginT+innerH/2)
	if limitRate > 0 {
		y := ys(limitRate)
		ew.printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#000" stroke-dasharray="6 4"/>`+"\n", marginL, y, marginL+innerW, y)
	}
	// Series.
	for i, res := range r.Results {
		rates := series[i]
		if len(rates) == 0 {
			continue
		}
		color := plotColors[i%len(plotColors)]
		bin := time.Duration(res.Timeline.Bin)
		el := time.Duration(res.Elapsed)
		var pts []string
		for j, v := range rates {
			mid := time.Duration(j)*bin + bin/2
			if end := time.Duration(j+1) * bin; end > el {
				mid = time.Duration(j)*bin + (el-time.Duration(j)*bin)/2
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs(mid), ys(v)))
		}
		ew.printf(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
	}
	// Legend.
	lx, ly := marginL+innerW+15, marginT+10
	for i, res := range r.Results {
		color := plotColors[i%len(plotColors)]
		y := ly + 22*i
		name := res.Mode
		if res.Partial {
			name += " (interrupted)"
		}
		ew.printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", lx, y, lx+24, y, color)
		ew.printf(`<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", lx+30, y, html.EscapeString(name))
	}
	if limitRate > 0 {
		y := ly + 22*len(r.Results)
		ew.printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000" stroke-dasharray="6 4"/>`+"\n", lx, y, lx+24, y)
		ew.printf(`<text x="%d" y="%d" dominant-baseline="middle">exact limit</text>`+"\n", lx+30, y)
	}
	ew.printf("</svg>\n")
	return ew.err
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten, for axis ends.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// fmtShort formats an axis value: 950, 12k, 1.5M.
func fmtShort(v float64) string {
	switch {
	case v >= 1e6:
		return trimFloat(v/1e6) + "M"
	case v >= 1e3:
		return trimFloat(v/1e3) + "k"
	}
	return trimFloat(v)
}

// trimFloat formats v with at most two decimals and no trailing zeros: 2, 2.5, 0.25.
func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
