"""Report: figures that only draw, and the offline HTML page."""
