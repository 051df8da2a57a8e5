// loadgen/svg.h: a small SVG line-plot writer for the compare report (latency CDFs, throughput
// vs concurrency, interactivity vs throughput): linear axes with round tick values, one polyline
// (and point markers) per series, a legend. Plain text out; no dependencies.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace k3::loadgen {

struct SvgSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // drawn in the given order
  bool markers = false;                           // a dot at every point
};

struct SvgPlot {
  std::string title, x_label, y_label;
  std::vector<SvgSeries> series;
  int width = 720, height = 440;
  std::string render() const;
};

// Escapes &, <, >, " and ' for XML text and attribute values.
std::string xml_escape(const std::string& s);
// About `target` round tick values (1, 2, 5 x 10^k steps) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace k3::loadgen
