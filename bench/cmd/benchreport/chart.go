package main

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

const chartWidth = 760

// Chart draws one panel per metric: horizontal bars per case (median; a
// whisker from the smallest to the largest repetition; value and ratio to
// the baseline written next to each bar; a dashed line at the baseline) when there is no scale n, lines against n per case otherwise
// (log scale when the values span two decades or more).
func Chart(title string, meds []Median, baseline string) string {
	t := layout(meds)
	var body strings.Builder
	y := 44
	if !t.scaled() {
		fmt.Fprintf(&body, `<text x="10" y="%d" fill="#555">bars: median over the repetitions; whiskers: smallest to largest repetition; dashed line: the baseline</text>`+"\n", y+2)
		y += 14
	}
	for _, m := range t.metrics {
		dir := "higher is better"
		if lowerIsBetter(t.units[m]) {
			dir = "lower is better"
		}
		fmt.Fprintf(&body, `<text x="10" y="%d" font-weight="bold">%s (%s, %s)</text>`+"\n", y+14, esc(m), esc(displayUnit(t.units[m])), dir)
		y += 24
		if t.scaled() {
			y += linePanel(&body, t, m, y)
		} else {
			y += barPanel(&body, t, m, baseline, y)
		}
		y += 26
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">`+"\n", chartWidth, y, chartWidth, y)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n"+`<text x="10" y="26" font-size="16" font-weight="bold">%s</text>`+"\n", esc(title))
	b.WriteString(body.String())
	b.WriteString("</svg>\n")
	return b.String()
}

func esc(s string) string { return html.EscapeString(s) }

// barPanel draws one bar per case and returns the height it used.
func barPanel(b *strings.Builder, t table, metric, baseline string, y0 int) int {
	const labelW, valueW, barH = 130, 190, 26
	plotW := chartWidth - labelW - valueW
	maxV := 0.0
	for _, c := range t.cases {
		if v, ok := t.get(c, 0, metric); ok {
			maxV = math.Max(maxV, math.Max(v.Value, v.Max))
		}
	}
	if maxV <= 0 {
		maxV = 1
	}
	base, hasBase := t.get(baseline, 0, metric)
	n := 0
	for _, c := range t.cases {
		if _, ok := t.get(c, 0, metric); ok {
			n++
		}
	}
	if hasBase && base.Value > 0 {
		x := labelW + int(float64(plotW)*base.Value/maxV)
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#555" stroke-dasharray="4 3"/>`+"\n", x, y0-2, x, y0+n*barH+2)
	}
	rows := 0
	for _, c := range t.cases {
		v, ok := t.get(c, 0, metric)
		if !ok {
			continue
		}
		y := y0 + rows*barH
		w := int(float64(plotW) * math.Max(v.Value, 0) / maxV)
		label := format(v.Value) + " " + displayUnit(v.Unit)
		if hasBase && base.Value != 0 {
			if c == baseline {
				label += "  (baseline)"
			} else {
				label += fmt.Sprintf("  (%.2f× %s)", v.Value/base.Value, baseline)
			}
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, labelW-6, y+barH/2+4, esc(c))
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%s %s: median %s, range %s–%s over %d reps</title></rect>`,
			labelW, y+2, max(w, 1), barH-4, palette[rows%len(palette)], esc(c), esc(metric), format(v.Value), format(v.Min), format(v.Max), v.Reps)
		lx := labelW + w + 5
		if v.Reps > 1 && v.Max > v.Min {
			// The spread over the repetitions: a whisker from min to max.
			x1, x2 := labelW+int(float64(plotW)*math.Max(v.Min, 0)/maxV), labelW+int(float64(plotW)*v.Max/maxV)
			fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#222"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#222"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#222"/>`,
				x1, y+barH/2, x2, y+barH/2, x1, y+barH/2-4, x1, y+barH/2+4, x2, y+barH/2-4, x2, y+barH/2+4)
			lx = max(lx, x2+5)
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" paint-order="stroke" stroke="white" stroke-width="3">%s</text>`+"\n", lx, y+barH/2+4, esc(label))
		rows++
	}
	return rows*barH + 4
}

// linePanel draws value against n, one line per case, and returns the
// height it used. The n values are spaced evenly (they usually grow by
// decades) and labelled.
func linePanel(b *strings.Builder, t table, metric string, y0 int) int {
	const left, right, plotH = 80, 190, 200
	plotW := chartWidth - left - right
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range t.cases {
		for _, n := range t.ns {
			if v, ok := t.get(c, n, metric); ok && !math.IsNaN(v.Value) {
				lo, hi = math.Min(lo, v.Value), math.Max(hi, v.Value)
			}
		}
	}
	if math.IsInf(hi, -1) {
		return 0
	}
	logScale := lo > 0 && hi/lo >= 100
	var ticks []float64
	var yOf func(float64) int
	if logScale {
		a, z := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if z == a {
			z++
		}
		for e := a; e <= z; e++ {
			ticks = append(ticks, math.Pow(10, e))
		}
		yOf = func(v float64) int {
			return y0 + plotH - int(float64(plotH)*(math.Log10(v)-a)/(z-a))
		}
	} else {
		step := niceStep(math.Max(hi, 1e-9) / 4)
		top := step * math.Ceil(hi/step)
		if top <= 0 {
			// Every value 0 (no long tasks, say): a step sized for
			// 1e-9 would make billions of ticks.
			top, step = 1, 0.25
		}
		for i := 0.0; i*step <= top*1.0001; i++ {
			ticks = append(ticks, i*step)
		}
		yOf = func(v float64) int { return y0 + plotH - int(float64(plotH)*v/top) }
	}
	xOf := func(i int) int {
		if len(t.ns) == 1 {
			return left + plotW/2
		}
		return left + i*plotW/(len(t.ns)-1)
	}
	for _, tv := range ticks {
		y := yOf(tv)
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/><text x="%d" y="%d" text-anchor="end">%s</text>`+"\n",
			left, y, left+plotW, y, left-6, y+4, tick(tv))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`, left, y0+plotH, left+plotW, y0+plotH)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`+"\n", left, y0, left, y0+plotH)
	for i, n := range t.ns {
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">n=%d</text>`, xOf(i), y0+plotH+16, n)
	}
	if logScale {
		fmt.Fprintf(b, `<text x="%d" y="%d" fill="#666" text-anchor="end">log scale</text>`, left+plotW, y0-6)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" fill="#666">at n=%d:</text>`+"\n", left+plotW+12, y0+8, t.ns[len(t.ns)-1])
	legend := 0
	for j, c := range t.cases {
		color := palette[j%len(palette)]
		var pts []string
		last := ""
		for i, n := range t.ns {
			v, ok := t.get(c, n, metric)
			if !ok || math.IsNaN(v.Value) || (logScale && v.Value <= 0) {
				continue
			}
			x, y := xOf(i), yOf(v.Value)
			pts = append(pts, fmt.Sprintf("%d,%d", x, y))
			fmt.Fprintf(b, `<circle cx="%d" cy="%d" r="3" fill="%s"><title>%s n=%d: %s</title></circle>`, x, y, color, esc(c), n, format(v.Value))
			last = "—"
			if n == t.ns[len(t.ns)-1] {
				last = format(v.Value)
			}
		}
		if len(pts) > 1 {
			fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
		}
		if len(pts) > 0 {
			ly := y0 + 16 + legend*18
			fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s: %s</text>`,
				left+plotW+12, ly+4, color, left+plotW+26, ly+13, esc(c), last)
			legend++
		}
		b.WriteString("\n")
	}
	return plotH + 22
}

// tick formats an axis value with no more decimals than a tick step (a
// power of ten times 1, 2 or 5) needs.
func tick(v float64) string {
	if v == 0 {
		return "0"
	}
	d := 0
	if e := math.Floor(math.Log10(math.Abs(v)) + 1e-9); e < 0 {
		d = int(-e)
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}

// niceStep rounds a raw tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f <= 1:
		return p
	case f <= 2:
		return 2 * p
	case f <= 5:
		return 5 * p
	}
	return 10 * p
}
