"use strict";
/* Draws a roofline figure (the data perf/roofline_figure.py builds) as SVG: log-log axes, the roof
   y = min(peak, bandwidth * x), the ridge, and points coloured by kind with their hover text. The live
   dashboard and the self-contained HTML export (dashboard/export.py) both draw with this file, and the PNG
   export draws the same data with matplotlib, so every copy of the picture agrees. */
(function (global) {
  const SVG = "http://www.w3.org/2000/svg";
  const MARGIN = { left: 70, right: 18, top: 30, bottom: 46 };
  const X_PADDING = 4, Y_PADDING = 1.5; // as perf/roofline_figure.py's axis_range pads them

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (parent) parent.appendChild(node);
    return node;
  }

  function si(value) {
    for (const [factor, prefix] of [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
      if (value >= factor) return `${+(value / factor).toPrecision(3)} ${prefix}`;
    }
    return `${+value.toPrecision(3)} `;
  }

  function padded(values, padding) {
    const good = values.filter((v) => v > 0 && Number.isFinite(v));
    return [Math.min(...good) / padding, Math.max(...good) * padding];
  }

  class RooflineChart {
    constructor(container, figure, options = {}) {
      this.width = options.width || 760;
      this.height = options.height || 460;
      this.maxPoints = options.maxPoints || 600;
      this.container = container;
      this.svg = el("svg", { viewBox: `0 0 ${this.width} ${this.height}`, class: "roofline", role: "img" }, container);
      this.tooltip = document.createElement("div");
      this.tooltip.className = "roofline-tooltip";
      this.tooltip.hidden = true;
      container.appendChild(this.tooltip);
      this.setFigure(figure);
    }

    setFigure(figure) {
      this.figure = figure;
      this.points = figure.points.slice(-this.maxPoints);
      this.xRange = figure.x_range.slice();
      this.yRange = figure.y_range.slice();
      this.render();
    }

    /* New points (oldest first); the oldest beyond maxPoints are dropped. Redraws all only when one falls
       outside the axes, which then grow by the same padding the Python side uses. */
    addPoints(points) {
      if (!points.length) return;
      this.points.push(...points);
      const dropped = Math.max(0, this.points.length - this.maxPoints);
      this.points.splice(0, dropped);
      for (let i = 0; i < dropped && this.pointLayer.firstChild; i++) this.pointLayer.firstChild.remove();
      const inside = points.every((p) => p.x > this.xRange[0] && p.x < this.xRange[1] && p.y > this.yRange[0] && p.y < this.yRange[1]);
      if (!inside) {
        const f = this.figure;
        const xs = [f.ridge, ...this.points.map((p) => p.x)];
        this.xRange = padded(xs, X_PADDING);
        this.yRange = padded([f.bandwidth * this.xRange[0], f.peak_flops, ...this.points.map((p) => p.y)], Y_PADDING);
        this.render();
        return;
      }
      for (const p of points) this.drawPoint(p);
    }

    sx(x) {
      const [a, b] = this.xRange.map(Math.log10);
      return MARGIN.left + ((Math.log10(x) - a) / (b - a)) * (this.width - MARGIN.left - MARGIN.right);
    }

    sy(y) {
      const [a, b] = this.yRange.map(Math.log10);
      return this.height - MARGIN.bottom - ((Math.log10(y) - a) / (b - a)) * (this.height - MARGIN.top - MARGIN.bottom);
    }

    render() {
      const f = this.figure, svg = this.svg;
      svg.replaceChildren();
      const left = MARGIN.left, right = this.width - MARGIN.right, top = MARGIN.top, bottom = this.height - MARGIN.bottom;
      el("rect", { x: left, y: top, width: right - left, height: bottom - top, class: "plot-area" }, svg);
      this.drawAxis("x", left, right, top, bottom);
      this.drawAxis("y", left, right, top, bottom);
      // The roof: the bandwidth slope up to the ridge, flat at peak beyond it.
      const [x0, x1] = this.xRange;
      const roof = [x0, Math.min(Math.max(f.ridge, x0), x1), x1].map((x) => [this.sx(x), this.sy(Math.min(f.peak_flops, f.bandwidth * x))]);
      el("polyline", { points: roof.map((p) => p.join(",")).join(" "), class: "roof" }, svg);
      const rx = this.sx(f.ridge);
      el("line", { x1: rx, x2: rx, y1: top, y2: bottom, class: "ridge", "data-ridge": f.ridge }, svg);
      el("text", { x: rx + 4, y: top + 12, class: "ridge-label" }, svg).textContent = f.ceilings.ridge;
      el("text", { x: right - 4, y: this.sy(f.peak_flops) + 16, class: "ceiling-label", "text-anchor": "end" }, svg).textContent = f.ceilings.compute;
      const along = Math.sqrt(x0 * Math.min(f.ridge, x1)); // half way up the slope (on the log scale)
      const slope = Math.atan2(this.sy(f.bandwidth * along * 2) - this.sy(f.bandwidth * along), this.sx(along * 2) - this.sx(along)) * 180 / Math.PI;
      const [mx, my] = [this.sx(along), this.sy(f.bandwidth * along) - 8];
      el("text", { x: mx, y: my, class: "ceiling-label", "text-anchor": "middle", transform: `rotate(${slope} ${mx} ${my})` }, svg).textContent = f.ceilings.memory;
      el("text", { x: (left + right) / 2, y: 18, class: "chart-title", "text-anchor": "middle" }, svg).textContent = f.title;
      this.drawLegend(left + 8, top + 8);
      this.pointLayer = el("g", { class: "points" }, svg);
      for (const p of this.points) this.drawPoint(p);
    }

    drawAxis(axis, left, right, top, bottom) {
      const [a, b] = (axis === "x" ? this.xRange : this.yRange).map(Math.log10);
      for (let e = Math.ceil(a); e <= Math.floor(b); e++) {
        const v = 10 ** e;
        if (axis === "x") {
          const x = this.sx(v);
          el("line", { x1: x, x2: x, y1: top, y2: bottom, class: "grid" }, this.svg);
          el("text", { x, y: bottom + 16, class: "tick", "text-anchor": "middle" }, this.svg).textContent = si(v).trim();
        } else {
          const y = this.sy(v);
          el("line", { x1: left, x2: right, y1: y, y2: y, class: "grid" }, this.svg);
          el("text", { x: left - 6, y: y + 4, class: "tick", "text-anchor": "end" }, this.svg).textContent = si(v).trim();
        }
      }
      const f = this.figure;
      if (axis === "x") {
        el("text", { x: (left + right) / 2, y: this.height - 8, class: "axis-label", "text-anchor": "middle" }, this.svg).textContent = f.x_label;
      } else {
        const label = el("text", { x: 16, y: (top + bottom) / 2, class: "axis-label", "text-anchor": "middle",
          transform: `rotate(-90 16 ${(top + bottom) / 2})` }, this.svg);
        label.textContent = f.y_label;
      }
    }

    drawLegend(x, y) {
      const kinds = [...new Set(this.points.map((p) => p.kind))];
      const shown = kinds.length ? kinds : ["decode", "prefill", "mixed"].filter((k) => k in this.figure.kinds);
      shown.forEach((kind, i) => {
        const style = this.figure.kinds[kind];
        el("circle", { cx: x + 5, cy: y + 6 + i * 16, r: 5, fill: style.colour, class: "legend-dot" }, this.svg);
        el("text", { x: x + 14, y: y + 10 + i * 16, class: "legend" }, this.svg).textContent = style.label;
      });
    }

    drawPoint(p) {
      const style = this.figure.kinds[p.kind] || { colour: "#555" };
      const cx = this.sx(p.x), cy = this.sy(p.y);
      const dot = el("circle", { cx, cy, r: p.annotate ? 5 : 3.5, fill: style.colour, class: `point kind-${p.kind}`,
        "data-x": p.x, "data-y": p.y, "data-kind": p.kind }, this.pointLayer);
      if (p.annotate) { // decode labels below the point, the others above (as the PNG places them)
        const below = p.kind.endsWith("decode");
        el("text", { x: cx + 4, y: below ? cy + 14 : cy - 7, class: "point-label", fill: style.colour }, this.pointLayer).textContent = p.label;
      }
      dot.addEventListener("mouseenter", () => this.showTooltip(p, cx, cy));
      dot.addEventListener("mouseleave", () => { this.tooltip.hidden = true; });
    }

    showTooltip(p, cx, cy) {
      const lines = p.detail.length ? p.detail : [p.label];
      this.tooltip.replaceChildren(...lines.map((line) => Object.assign(document.createElement("div"), { textContent: line })));
      const box = this.svg.getBoundingClientRect(), scale = box.width / this.width;
      this.tooltip.hidden = false;
      // Beside the point, on whichever side leaves room.
      const left = cx * scale + 12, top = cy * scale + 12;
      this.tooltip.style.left = `${left + this.tooltip.offsetWidth > box.width ? cx * scale - 12 - this.tooltip.offsetWidth : left}px`;
      this.tooltip.style.top = `${top + this.tooltip.offsetHeight > box.height ? cy * scale - 12 - this.tooltip.offsetHeight : top}px`;
    }
  }

  global.RooflineChart = RooflineChart;
  global.rooflineSI = si;
})(window);
