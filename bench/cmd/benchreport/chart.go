package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"}

// Chart draws one panel per metric: horizontal bars per case when there is
// no scale, lines against n (log scale when n spans decades) otherwise.
func Chart(title string, meds []Median) string {
	cases, ns, metrics, units, val := layout(meds)
	scaled := len(ns) > 1
	const width, panelH, top = 720, 240, 40
	height := top + len(metrics)*(panelH+30)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for i, m := range metrics {
		y0 := top + i*(panelH+30)
		dir := "higher is better"
		if lowerIsBetter(units[m]) {
			dir = "lower is better"
		}
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s (%s, %s)</text>`+"\n", y0+14, html.EscapeString(m), units[m], dir)
		if scaled {
			linePanel(&b, cases, ns, m, val, y0+24, width, panelH-24)
		} else {
			barPanel(&b, cases, m, val, y0+24, width, panelH-24)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func barPanel(b *strings.Builder, cases []string, metric string, val map[key]float64, y0, width, h int) {
	const labelW = 130
	maxV := 0.0
	for _, c := range cases {
		maxV = math.Max(maxV, val[key{c, 0, metric}])
	}
	if maxV == 0 {
		maxV = 1
	}
	barH := min(28, h/max(1, len(cases)))
	for j, c := range cases {
		v, ok := val[key{c, 0, metric}]
		if !ok {
			continue
		}
		y := y0 + j*barH
		w := int(float64(width-labelW-90) * v / maxV)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, labelW-6, y+barH/2+4, html.EscapeString(c))
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`, labelW, y+2, max(w, 1), barH-4, palette[j%len(palette)])
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", labelW+w+4, y+barH/2+4, format(v))
	}
}

func linePanel(b *strings.Builder, cases []string, ns []int, metric string, val map[key]float64, y0, width, h int) {
	const left, right = 60, 150
	plotW, plotH := width-left-right, h-30
	maxV := 0.0
	for _, c := range cases {
		for _, n := range ns {
			maxV = math.Max(maxV, val[key{c, n, metric}])
		}
	}
	if maxV == 0 {
		maxV = 1
	}
	xOf := func(i int) int { return left + i*plotW/max(1, len(ns)-1) }
	yOf := func(v float64) int { return y0 + plotH - int(float64(plotH)*v/maxV) }
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`, left, y0+plotH, left+plotW, y0+plotH)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`, left, y0, left, y0+plotH)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text><text x="%d" y="%d" text-anchor="end">0</text>`,
		left-4, y0+8, format(maxV), left-4, y0+plotH)
	for i, n := range ns {
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">n=%d</text>`, xOf(i), y0+plotH+16, n)
	}
	for j, c := range cases {
		var pts []string
		for i, n := range ns {
			if v, ok := val[key{c, n, metric}]; ok {
				pts = append(pts, fmt.Sprintf("%d,%d", xOf(i), yOf(v)))
			}
		}
		color := palette[j%len(palette)]
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
		fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", left+plotW+8, y0+14+j*16, color, html.EscapeString(c))
	}
}
