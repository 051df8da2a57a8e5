// loadgen/svg.cpp: the SVG line-plot writer.
#include "loadgen/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace k3::loadgen {

namespace {

// Colour-blind-friendly palette (Okabe-Ito), cycled.
constexpr const char* kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                   "#E69F00", "#56B4E9", "#F0E442", "#000000"};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string tick_label(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) std::snprintf(buf, sizeof(buf), "%.1e", v);
  else std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  return ticks;
}

std::string SvgPlot::render() const {
  const double left = 70, right = 170, top = 40, bottom = 50;  // margins; the legend sits right
  const double pw = width - left - right, ph = height - top - bottom;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const SvgSeries& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  y0 = std::min(y0, 0.0);  // axes start at zero, so heights compare as ratios
  x0 = std::min(x0, 0.0);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  const std::vector<double> xt = nice_ticks(x0, x1), yt = nice_ticks(y0, y1);
  x1 = std::max(x1, xt.back());
  y1 = std::max(y1, yt.back());
  auto sx = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto sy = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
       std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(width) + "\" height=\"" + std::to_string(height) +
       "\" fill=\"white\"/>\n";
  o += "<text x=\"" + num(width / 2.0) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + xml_escape(title) +
       "</text>\n";
  for (double t : xt) {
    o += "<line x1=\"" + num(sx(t)) + "\" y1=\"" + num(top) + "\" x2=\"" + num(sx(t)) + "\" y2=\"" + num(top + ph) +
         "\" stroke=\"#e0e0e0\"/>\n";
    o += "<text x=\"" + num(sx(t)) + "\" y=\"" + num(top + ph + 16) + "\" text-anchor=\"middle\">" +
         xml_escape(tick_label(t)) + "</text>\n";
  }
  for (double t : yt) {
    o += "<line x1=\"" + num(left) + "\" y1=\"" + num(sy(t)) + "\" x2=\"" + num(left + pw) + "\" y2=\"" + num(sy(t)) +
         "\" stroke=\"#e0e0e0\"/>\n";
    o += "<text x=\"" + num(left - 6) + "\" y=\"" + num(sy(t) + 4) + "\" text-anchor=\"end\">" +
         xml_escape(tick_label(t)) + "</text>\n";
  }
  o += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
       "\" fill=\"none\" stroke=\"black\"/>\n";
  o += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(height - 12.0) + "\" text-anchor=\"middle\">" +
       xml_escape(x_label) + "</text>\n";
  o += "<text x=\"16\" y=\"" + num(top + ph / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " +
       num(top + ph / 2) + ")\">" + xml_escape(y_label) + "</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const SvgSeries& s = series[i];
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    std::string pts;
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) pts += num(sx(x)) + "," + num(sy(y)) + " ";
    if (!pts.empty()) pts.pop_back();
    o += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"1.8\" points=\"" + pts +
         "\"/>\n";
    if (s.markers)
      for (const auto& [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y))
          o += "<circle cx=\"" + num(sx(x)) + "\" cy=\"" + num(sy(y)) + "\" r=\"3\" fill=\"" + color + "\"/>\n";
    const double ly = top + 10 + 18.0 * static_cast<double>(i);
    o += "<line x1=\"" + num(left + pw + 10) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(left + pw + 30) + "\" y2=\"" +
         num(ly) + "\" stroke=\"" + color + "\" stroke-width=\"3\"/>\n";
    o += "<text x=\"" + num(left + pw + 35) + "\" y=\"" + num(ly + 4) + "\">" + xml_escape(s.name) + "</text>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace k3::loadgen
